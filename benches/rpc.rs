//! Request/response round trips over QUIC on loopback, between this process
//! and a node process of a two-node local cluster (the same endpoint,
//! framing and handler path that node-to-node calls use).
//!
//! ```text
//! make bench          # or: cargo bench --bench rpc
//! ```
//!
//! For 64 B and 1 MiB payloads, with 1 and with 64 requests in flight, it
//! prints latency percentiles and throughput as `name: value unit` lines.
//! Run without `--bench` (as `cargo test --all-targets` does), it makes a
//! hundredth of the requests: a smoke test that the benchmark still works.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use nimbus::client;
use nimbus::cluster::{ControlReply, ControlRequest};
use nimbus::local::LocalCluster;
use nimbus::transport::{Connection, RequestOptions};

const CASES: [(usize, &str, usize, usize); 4] = [
    // (payload bytes, label, requests in flight, requests measured)
    (64, "64B", 1, 20_000),
    (64, "64B", 64, 100_000),
    (1 << 20, "1MiB", 1, 500),
    (1 << 20, "1MiB", 64, 2_000),
];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let scale = if std::env::args().any(|a| a == "--bench") {
        1
    } else {
        100
    };
    let cluster = LocalCluster::builder()
        .program(env!("CARGO_BIN_EXE_nimbus"))
        .nodes(2)
        .start()?;
    let client = cluster.client().await?;
    let node = client
        .status()
        .await?
        .node("node-1")
        .cloned()
        .expect("node-1 joined");
    let connection = client.connect_node(&node).await?;
    println!(
        "# echo round trips to {} over QUIC on loopback",
        node.address
    );
    for (payload, label, in_flight, requests) in CASES {
        let requests = (requests / scale).max(in_flight);
        run(&connection, payload, in_flight, requests / 10).await?;
        let (histogram, elapsed) = run(&connection, payload, in_flight, requests).await?;
        let name = format!("rpc_{label}_inflight{in_flight}");
        let us = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        let per_s = requests as f64 / elapsed.as_secs_f64();
        println!("{name}_p50: {:.1} us", us(0.5));
        println!("{name}_p99: {:.1} us", us(0.99));
        println!("{name}_throughput: {per_s:.0} req/s");
        // Each round trip carries the payload both ways.
        println!(
            "{name}_round_trip_payload_rate: {:.1} MB/s",
            2.0 * per_s * payload as f64 / 1e6
        );
    }
    drop(client);
    cluster.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// Sends `requests` echoes of `payload` bytes, `in_flight` at a time.
async fn run(
    connection: &Connection,
    payload: usize,
    in_flight: usize,
    requests: usize,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    let remaining = Arc::new(AtomicUsize::new(requests));
    let started = Instant::now();
    let mut senders = Vec::new();
    for _ in 0..in_flight {
        let (connection, remaining) = (connection.clone(), remaining.clone());
        senders.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new(3)?;
            let request = ControlRequest::Echo(nimbus::cluster::Echo(vec![0x5a; payload]));
            while claim(&remaining) {
                let sent = Instant::now();
                match client::exchange(&connection, &request, RequestOptions::bulk()).await? {
                    ControlReply::Echo(nimbus::cluster::Echo(back))
                        if back.len() == payload && back.iter().all(|b| *b == 0x5a) => {}
                    _ => anyhow::bail!("the echo of {payload} bytes came back different"),
                }
                histogram.record(sent.elapsed().as_nanos() as u64)?;
            }
            anyhow::Ok(histogram)
        }));
    }
    let mut histogram = Histogram::<u64>::new(3)?;
    for sender in senders {
        histogram.add(sender.await??)?;
    }
    Ok((histogram, started.elapsed()))
}

/// Takes one request from the shared budget; false once it is spent.
fn claim(remaining: &AtomicUsize) -> bool {
    remaining
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}
