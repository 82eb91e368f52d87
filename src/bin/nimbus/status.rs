//! `nimbus status`: the cluster's nodes, their state and resources.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use nimbus::client::ClusterClient;
use nimbus::cluster::{ClusterStatus, NodeState};
use nimbus::transport::TransportConfig;

use crate::{start::token_from, state};

/// Options of `nimbus status`.
#[derive(Args)]
pub struct StatusArgs {
    /// The head's HOST:PORT (default: the head started on this machine).
    #[arg(long)]
    address: Option<String>,
    /// The cluster's token (default: $NIMBUS_TOKEN, then this machine's token file).
    #[arg(long)]
    token: Option<String>,
    /// Print JSON: an object with a `nodes` array.
    #[arg(long)]
    json: bool,
    /// Seconds to wait for the head.
    #[arg(long, default_value_t = 5)]
    timeout_s: u64,
}

/// Runs `nimbus status`.
pub fn run(args: StatusArgs) -> Result<()> {
    let address = match args.address {
        Some(address) => address,
        None => {
            state::load_head()
                .context("no --address given and no head was started on this machine")?
                .address
        }
    };
    let token = token_from(args.token.as_deref())?;
    let config = TransportConfig {
        connect_timeout: Duration::from_secs(args.timeout_s),
        ..TransportConfig::default()
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let status = runtime.block_on(async {
        let client = ClusterClient::connect_with(&address, &token, config).await?;
        client.status().await
    })?;
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
    println!("{alive} alive, {} dead", status.nodes.len() - alive);
}
