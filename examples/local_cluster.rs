//! A three-node cluster on this machine: membership, resources, failure
//! detection and a clean shutdown.
//!
//! ```text
//! make demo                       # or: make run EXAMPLE=local_cluster
//! ```
//!
//! You should see three alive nodes with their resources, then `node-2`
//! killed with SIGKILL and declared dead within the heartbeat timeout (3 s),
//! then every node stopping on SIGTERM, and a last `summary:` line.
//! The nodes are real `nimbus start --block` processes on loopback, found
//! next to this example's executable (or at `$NIMBUS_BIN`).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::time::{Duration, Instant};

use anyhow::Result;
use nimbus::cluster::{ClusterStatus, NodeState};
use nimbus::local::LocalCluster;

const NODES: usize = 3;
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

/// A three-node cluster on this machine: membership, resources, failure
/// detection and a clean shutdown (no options).
#[derive(clap::Parser)]
struct Args {}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    <Args as clap::Parser>::parse();
    let started = Instant::now();
    let mut cluster = LocalCluster::builder()
        .nodes(NODES)
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .start()?;
    println!(
        "started {NODES} node processes in {:.2?}; head at {}",
        started.elapsed(),
        cluster.address()
    );
    let client = cluster.client().await?;
    let status = client.status().await?;
    print_status(&status);

    let victim = cluster.node(2)?.name().to_string();
    println!(
        "\nkilling {victim} (pid {}) with SIGKILL",
        cluster.node(2)?.pid()
    );
    let killed_at = Instant::now();
    cluster.kill(2)?;
    let status = client
        .wait_for_status("the kill to be detected", 3 * HEARTBEAT_TIMEOUT, |s| {
            s.node(&victim).is_some_and(|n| n.state == NodeState::Dead)
        })
        .await?;
    let detected = killed_at.elapsed();
    println!("{victim} declared dead after {detected:.2?} (timeout {HEARTBEAT_TIMEOUT:?})");
    print_status(&status);
    let alive_after = status.alive().count();

    println!("\nstopping the cluster (SIGTERM to every node)");
    drop(client);
    let clean = cluster.shutdown(Duration::from_secs(10))?;
    println!(
        "all nodes stopped{}",
        if clean {
            " cleanly"
        } else {
            " (some had to be killed)"
        }
    );
    println!(
        "summary: nodes={NODES} killed={victim} detected_ms={} heartbeat_timeout_ms={} alive_after={alive_after} clean_shutdown={clean}",
        detected.as_millis(),
        HEARTBEAT_TIMEOUT.as_millis()
    );
    Ok(())
}

fn print_status(status: &ClusterStatus) {
    for node in &status.nodes {
        let state = match node.state {
            NodeState::Alive => "alive",
            NodeState::Dead => "dead ",
        };
        let role = if node.head { "head" } else { "    " };
        println!(
            "  {state} {role} {:<8} incarnation {} at {}  {}",
            node.id, node.incarnation, node.address, node.resources.total
        );
    }
}
