//! `nimbus logs`: an actor's (stdout, or stderr with `--stderr`), a
//! submitted job's or a node's log, read from the node that has it, its
//! last lines or followed as it grows.

use std::io::Write;
use std::time::Duration;

use crate::client::{ClusterClient, LogChunk};
use crate::cluster::{ActorRecord, JobRecord, NodeStatus};
use anyhow::{Context, Result};
use clap::Args;

use super::head_args::HeadArgs;

/// Options of `nimbus logs`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).multiple(true).args(["actor", "job", "node"])))]
pub(crate) struct LogsArgs {
    /// The actor: its name, or its id as `nimbus list actors` shows it.
    actor: Option<String>,
    /// A submitted job's driver log instead (`nimbus job list` shows
    /// ids); with an actor's name, the actor of that name in that job,
    /// found dead too once its job has ended.
    #[arg(long)]
    job: Option<String>,
    /// A node's own log instead (`nimbus status` shows names).
    #[arg(long, conflicts_with_all = ["actor", "job"])]
    node: Option<String>,
    #[command(flatten)]
    head: HeadArgs,
    /// Print only the last N lines.
    #[arg(long, default_value_t = 1000)]
    tail: usize,
    /// Keep printing what is written until the actor's worker exits, the
    /// job ends or the node leaves.
    #[arg(long)]
    follow: bool,
    /// The actor's stderr log rather than its stdout's.
    #[arg(long, conflicts_with = "node")]
    stderr: bool,
}

/// Most bytes `nimbus logs` reads back for `--tail`, and per read.
const TAIL_BYTES: u64 = 1 << 20;
/// How often `--follow` reads on.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

/// Whose log.
enum Source {
    /// An actor's stdout log, or with `true` its stderr log.
    Actor(ActorRecord, bool),
    Job(JobRecord),
    Node(NodeStatus),
}

impl Source {
    async fn find(client: &ClusterClient, args: &LogsArgs) -> Result<Source> {
        if args.stderr && args.actor.is_none() {
            anyhow::bail!("--stderr reads an actor's stderr log: name the actor too");
        }
        if let (Some(actor), Some(job)) = (&args.actor, &args.job) {
            let record = client.find_actor_in_job(actor, job).await?.with_context(|| {
                format!("no actor named {actor:?} in job {job:?}, live or among the dead the head keeps (`nimbus list actors --filter job={job}` lists them)")
            })?;
            return Ok(Source::Actor(record, args.stderr));
        }
        if let Some(actor) = &args.actor {
            let record = client.find_actor(actor).await?.with_context(|| {
                format!("no live actor named {actor:?} (a dead one: by name with --job ID, or by its id; `nimbus list actors --filter state=DEAD` lists both)")
            })?;
            return Ok(Source::Actor(record, args.stderr));
        }
        if let Some(job) = &args.job {
            return Ok(Source::Job(client.job(job).await?));
        }
        let name = args.node.as_deref().unwrap_or_default();
        let node = client.status().await?.node(name).cloned();
        Ok(Source::Node(node.with_context(|| {
            format!("no node named {name:?} (nimbus status lists them)")
        })?))
    }

    async fn read(&self, client: &ClusterClient, offset: u64, max: u64) -> Result<LogChunk> {
        Ok(match self {
            Source::Actor(record, stderr) => client.read_log(record, *stderr, offset, max).await?,
            Source::Job(job) => client.read_job_log(job, offset, max).await?,
            Source::Node(node) => client.read_node_log(node, offset, max).await?,
        })
    }

    /// Whether nothing more will be written: the worker exited, the job
    /// ended, the node left.
    async fn ended(&self, client: &ClusterClient) -> Result<bool> {
        Ok(match self {
            Source::Actor(record, _) => client
                .find_actor(&record.actor.to_string())
                .await?
                .is_none_or(|r| r.dead.is_some() || r.incarnation != record.incarnation),
            Source::Job(job) => client.job(&job.id).await?.state.is_terminal(),
            Source::Node(node) => client
                .status()
                .await?
                .alive()
                .all(|n| n.id != node.id || n.incarnation != node.incarnation),
        })
    }
}

/// Runs `nimbus logs`.
pub(crate) fn logs(args: LogsArgs) -> Result<()> {
    args.head.with_client(async |client| {
        let source = Source::find(&client, &args).await?;
        let end = source.read(&client, 0, 0).await?.total;
        let chunk = source
            .read(&client, end.saturating_sub(TAIL_BYTES), TAIL_BYTES)
            .await?;
        let text = String::from_utf8_lossy(&chunk.bytes);
        let lines: Vec<&str> = text.lines().collect();
        let mut out = std::io::stdout().lock();
        for line in &lines[lines.len().saturating_sub(args.tail)..] {
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        drop(out);
        if !args.follow {
            return Ok(());
        }
        let mut offset = chunk.total;
        loop {
            // Whether it had ended before the read: then the read has all.
            let ended = source.ended(&client).await?;
            let mut more = source.read(&client, offset, TAIL_BYTES).await?;
            if more.total < offset {
                eprintln!("(the log was rotated: reading it from its start)");
                offset = 0;
                more = source.read(&client, offset, TAIL_BYTES).await?;
            }
            offset += more.bytes.len() as u64;
            if !more.bytes.is_empty() {
                let mut out = std::io::stdout().lock();
                out.write_all(&more.bytes)?;
                out.flush()?;
                continue;
            }
            if ended {
                return Ok(());
            }
            tokio::time::sleep(FOLLOW_INTERVAL).await;
        }
    })
}
