//! `nimbus list` and `nimbus kill`: the cluster's state as rows, and
//! `ray.kill` from the command line.

use crate::client::Listing;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::{Map, Value};

use super::head_args::HeadArgs;

/// What `nimbus list` lists.
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Listed {
    /// Actors, live (alive or restarting) and the dead ones the head keeps (the last 1,000 per job; --filter state=DEAD): id, name, class, state, node, address, incarnation, restarts, job, pid, death.
    Actors,
    /// Nodes: id, state, head, incarnation, address, resources.
    Nodes,
    /// Objects in every live node's store: id, node, size, state, owned, holders.
    Objects,
    /// Jobs, live and ended: id, name, state, submitted, node, entrypoint, driver pid, times, message.
    Jobs,
    /// Placement groups, from the bundles the live nodes hold: id, job, bundles, nodes, resources, used.
    PlacementGroups,
    /// Tasks (the head keeps the last 10,000): id, name, state, job, node, worker, attempts, error, times.
    Tasks,
    /// Training runs (the head keeps the last 100): id, name, job, state, attempts, reports, checkpoints, last loss, dir, times.
    Runs,
}

impl From<Listed> for Listing {
    fn from(listed: Listed) -> Listing {
        match listed {
            Listed::Actors => Listing::Actors,
            Listed::Nodes => Listing::Nodes,
            Listed::Objects => Listing::Objects,
            Listed::Jobs => Listing::Jobs,
            Listed::PlacementGroups => Listing::PlacementGroups,
            Listed::Tasks => Listing::Tasks,
            Listed::Runs => Listing::Runs,
        }
    }
}

/// Options of `nimbus list`.
#[derive(Args)]
pub(crate) struct ListArgs {
    /// What to list.
    what: Listed,
    #[command(flatten)]
    head: HeadArgs,
    /// Only rows whose KEY (a column, as in --json) equals VALUE; repeat to
    /// require several.
    #[arg(long, value_name = "KEY=VALUE")]
    filter: Vec<String>,
    /// Print a JSON array of rows.
    #[arg(long)]
    json: bool,
    /// Print at most this many rows.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

/// Runs `nimbus list`.
pub(crate) fn list(args: ListArgs) -> Result<()> {
    let filters = args
        .filter
        .iter()
        .map(|f| {
            f.split_once('=')
                .with_context(|| format!("--filter {f:?} is not KEY=VALUE"))
        })
        .collect::<Result<Vec<_>>>()?;
    let what = args.what.into();
    let rows = args
        .head
        .with_client(async |client| Ok(client.list(what).await?))?;
    if let Some(row) = rows.first() {
        for (key, _) in &filters {
            if !row.contains_key(*key) {
                let columns: Vec<&str> = row.keys().map(String::as_str).collect();
                bail!(
                    "--filter {key}: no such column (columns: {})",
                    columns.join(", ")
                );
            }
        }
    }
    let matching: Vec<Map<String, Value>> = rows
        .into_iter()
        .filter(|row| {
            filters
                .iter()
                .all(|(key, value)| row.get(*key).is_some_and(|v| text(v) == *value))
        })
        .collect();
    let shown = &matching[..matching.len().min(args.limit)];
    if args.json {
        println!("{}", serde_json::to_string_pretty(shown)?);
    } else {
        print_table(shown);
    }
    if matching.len() > shown.len() {
        eprintln!(
            "{} more not shown (--limit {})",
            matching.len() - shown.len(),
            args.limit
        );
    }
    Ok(())
}

/// A cell as text: strings without quotes.
pub(crate) fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(crate) fn print_table(rows: &[Map<String, Value>]) {
    let Some(first) = rows.first() else {
        println!("(none)");
        return;
    };
    let columns: Vec<&String> = first.keys().collect();
    let width = |column: &String| {
        rows.iter()
            .map(|row| row.get(column.as_str()).map_or(0, |v| text(v).len()))
            .chain([column.len()])
            .max()
            .unwrap_or(0)
    };
    let widths: Vec<usize> = columns.iter().map(|c| width(c)).collect();
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(columns.iter().map(|c| c.to_uppercase()).collect());
    for row in rows {
        line(
            columns
                .iter()
                .map(|c| row.get(c.as_str()).map(text).unwrap_or_default())
                .collect(),
        );
    }
}

/// Options of `nimbus kill`.
#[derive(Args)]
pub(crate) struct KillArgs {
    /// The actor: its name, or its id as `nimbus list actors` shows it.
    actor: String,
    #[command(flatten)]
    head: HeadArgs,
}

/// Runs `nimbus kill`: the actor's worker is SIGKILLed and not restarted.
pub(crate) fn kill(args: KillArgs) -> Result<()> {
    let KillArgs { actor, head } = args;
    head.with_client(async |client| {
        let record = client
            .find_actor(&actor)
            .await?
            .with_context(|| format!("no actor named {actor:?}"))?;
        if let Some(death) = &record.dead {
            bail!("actor {} is dead already: {death}", record.actor);
        }
        client.kill_actor(&record).await?;
        println!("killed: {}", record.actor);
        Ok(())
    })
}
