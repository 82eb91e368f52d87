//! `nimbus memory`: what every node's object store holds: per object its
//! size, where its bytes are (memory, spilled, arriving), whether the node
//! owns it or caches a copy, and who holds references; totals per node.
//! At most `--limit` objects are listed (totals count them all).

use crate::cluster::{NodeState, ObjectSummary};
use anyhow::Result;
use clap::Args;
use serde_json::json;

use super::head_args::HeadArgs;

/// Options of `nimbus memory`.
#[derive(Args)]
pub(crate) struct MemoryArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// Print JSON: `{"nodes": [{"id", "objects", "owned", "used", "capacity", "spilled", "listed": [...]}]}`.
    #[arg(long)]
    json: bool,
    /// List at most this many objects in all (the totals count every one).
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

/// Runs `nimbus memory`.
pub(crate) fn run(args: MemoryArgs) -> Result<()> {
    let (json, mut left) = (args.json, args.limit);
    let mut nodes = Vec::new();
    let mut unlisted = 0;
    args.head.with_client(async |client| {
        let status = client.status().await?;
        for node in status.nodes.iter().filter(|n| n.state == NodeState::Alive) {
            let listing = client.objects(node).await?;
            let owned = listing.objects.iter().filter(|o| o.primary).count();
            let shown = listing.objects.len().min(left);
            left -= shown;
            unlisted += listing.objects.len() - shown;
            let objects = &listing.objects[..shown];
            if json {
                nodes.push(json!({
                    "id": node.id,
                    "objects": listing.objects.len(),
                    "owned": owned,
                    "used": listing.used,
                    "spare": listing.spare,
                    "capacity": listing.capacity,
                    "spilled": listing.spilled,
                    "listed": objects.iter().map(object_json).collect::<Vec<_>>(),
                }));
                continue;
            }
            println!(
                "node {}: {} objects ({owned} owned, {} cached copies), {} of {} bytes in memory ({} in spare files kept for reuse), {} bytes spilled to disk",
                node.id,
                listing.objects.len(),
                listing.objects.len() - owned,
                listing.used,
                listing.capacity,
                listing.spare,
                listing.spilled
            );
            for object in objects {
                println!("{}", object_line(object));
            }
        }
        Ok(())
    })?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "nodes": nodes }))?
        );
    }
    if unlisted > 0 {
        eprintln!(
            "{unlisted} more objects not listed (--limit {})",
            args.limit
        );
    }
    Ok(())
}

fn object_line(object: &ObjectSummary) -> String {
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
    line
}

fn object_json(object: &ObjectSummary) -> serde_json::Value {
    json!({
        "id": object.id.to_string(),
        "size": object.size,
        "state": object.state.to_string(),
        "owned": object.primary,
        "holders": object.holders,
        "in_transit": object.in_transit,
    })
}
