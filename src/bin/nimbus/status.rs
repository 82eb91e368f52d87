//! `nimbus status`: the cluster's nodes, their state and resources.

use anyhow::Result;
use clap::Args;
use nimbus::cluster::{ClusterStatus, NodeState, ResourceSet};

use crate::head::HeadArgs;

/// Options of `nimbus status`.
#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// Print JSON: an object with a `nodes` array.
    #[arg(long)]
    json: bool,
}

/// Runs `nimbus status`.
pub(crate) fn run(args: StatusArgs) -> Result<()> {
    let status = args
        .head
        .with_client(async |client| Ok(client.status().await?))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_table(&status);
    }
    Ok(())
}

fn print_table(status: &ClusterStatus) {
    println!(
        "{:<24} {:<6} {:<17} {:<22} RESOURCES (total; used)",
        "NODE", "STATE", "INCARNATION", "ADDRESS"
    );
    for node in &status.nodes {
        let state = match node.state {
            NodeState::Alive => "alive",
            NodeState::Dead => "dead",
        };
        let name = if node.head {
            format!("{} (head)", node.id)
        } else {
            node.id.clone()
        };
        println!(
            "{name:<24} {state:<6} {:<17} {:<22} {}; {}",
            node.incarnation, node.address, node.resources.total, node.resources.used
        );
        if let Some(reason) = &node.death_reason {
            println!("{:<24} {reason}", "");
        }
    }
    let alive = status.alive().count();
    let (mut total, mut used) = (ResourceSet::default(), ResourceSet::default());
    for node in status.alive() {
        total.add(&node.resources.total);
        used.add(&node.resources.used);
    }
    println!("{alive} alive, {} dead", status.nodes.len() - alive);
    println!("cluster (alive nodes): {total} total; {used} used");
}
