//! `nimbus memory`: what every node's object store holds.

use anyhow::Result;
use clap::Args;
use nimbus::client;
use nimbus::cluster::{ControlReply, ControlRequest, NodeState};
use nimbus::transport::RequestOptions;

use crate::head::HeadArgs;

/// Options of `nimbus memory`.
#[derive(Args)]
pub struct MemoryArgs {
    #[command(flatten)]
    head: HeadArgs,
}

/// Runs `nimbus memory`.
pub fn run(args: MemoryArgs) -> Result<()> {
    args.head.with_client(async |client| {
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
        Ok(())
    })
}
