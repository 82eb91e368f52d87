//! `nimbus memory`: what every node's object store holds: per object its
//! size, where its bytes are (memory, spilled, arriving), whether the node
//! owns it or caches a copy, and who holds references; totals per node.

use anyhow::Result;
use clap::Args;
use nimbus::cluster::NodeState;

use crate::head::HeadArgs;

/// Options of `nimbus memory`.
#[derive(Args)]
pub(crate) struct MemoryArgs {
    #[command(flatten)]
    head: HeadArgs,
}

/// Runs `nimbus memory`.
pub(crate) fn run(args: MemoryArgs) -> Result<()> {
    args.head.with_client(async |client| {
        let status = client.status().await?;
        for node in status.nodes.iter().filter(|n| n.state == NodeState::Alive) {
            let listing = client.objects(node).await?;
            let owned = listing.objects.iter().filter(|o| o.primary).count();
            println!(
                "node {}: {} objects ({owned} owned, {} cached copies), {} of {} bytes in memory, {} bytes spilled to disk",
                node.id,
                listing.objects.len(),
                listing.objects.len() - owned,
                listing.used,
                listing.capacity,
                listing.spilled
            );
            for object in listing.objects {
                let role = if object.primary { "owned" } else { "copy" };
                let mut line = format!(
                    "  {}  {:>12} bytes  {:<9}  {role}",
                    object.id, object.size, object.state
                );
                if object.primary {
                    line += &format!("  held by: {}", object.holders.join(", "));
                    if object.in_transit != 0 {
                        line += &format!("  in transit: {}", object.in_transit);
                    }
                }
                println!("{line}");
            }
        }
        Ok(())
    })
}
