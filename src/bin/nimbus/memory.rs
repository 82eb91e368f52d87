//! `nimbus memory`: what every node's object store holds.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use nimbus::client::{self, ClusterClient};
use nimbus::cluster::{ControlReply, ControlRequest, NodeState};
use nimbus::transport::{RequestOptions, TransportConfig};

use crate::{start::token_from, state};

/// Options of `nimbus memory`.
#[derive(Args)]
pub struct MemoryArgs {
    /// The head's HOST:PORT (default: the head started on this machine).
    #[arg(long)]
    address: Option<String>,
    /// The cluster's token (default: $NIMBUS_TOKEN, then this machine's token file).
    #[arg(long)]
    token: Option<String>,
    /// Seconds to wait for each node.
    #[arg(long, default_value_t = 5)]
    timeout_s: u64,
}

/// Runs `nimbus memory`.
pub fn run(args: MemoryArgs) -> Result<()> {
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
    runtime.block_on(async {
        let client = ClusterClient::connect_with(&address, &token, config).await?;
        let status = client.status().await?;
        for node in status.nodes.iter().filter(|n| n.state == NodeState::Alive) {
            let connection = client.connect_node(node).await?;
            let request = ControlRequest::ListObjects;
            let listing =
                match client::call(&connection, &request, RequestOptions::control()).await? {
                    ControlReply::Objects(listing) => listing,
                    other => anyhow::bail!("unexpected reply from {}: {other:?}", node.id),
                };
            println!(
                "node {}: {} objects, {} of {} bytes used",
                node.id,
                listing.objects.len(),
                listing.used,
                listing.capacity
            );
            for (id, size, complete) in listing.objects {
                let state = if complete { "stored" } else { "arriving" };
                println!("  {id}  {size:>12} bytes  {state}");
            }
        }
        anyhow::Ok(())
    })
}
