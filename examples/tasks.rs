//! Remote tasks and the object store on a 3-node local cluster:
//!
//! 1. 1,000 small tasks fanned out over the cluster (local node first, then
//!    the others as it fills up);
//! 2. a map-reduce over `ObjectRef`s: map tasks count the primes in ranges,
//!    a reduce task gathers their results (never read by the driver);
//! 3. a 256 MiB object broadcast to 3 nodes and read by 8 tasks: each node
//!    pulls it once (concurrent readers on a node share one transfer) and
//!    keeps one copy, whatever the number of its readers.
//!
//! ```text
//! make run EXAMPLE=tasks
//! make run EXAMPLE=tasks ARGS="--tasks 5000 --broadcast-mib 64"
//! ```

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use nimbus::actor::{ProcessContext, Registry, Strategy};
use nimbus::cluster::{MembershipReply, MembershipRequest};
use nimbus::object_store::{self, ObjectRef};
use nimbus::task::{self, Input, TaskFn, TaskOptions};
use serde_bytes::ByteBuf;

/// Spins for about `micros` microseconds, then says which node it ran on.
const WORK: TaskFn<u64, String> = TaskFn::new("tasks.work");
/// Counts the primes in `[start, end)`.
const COUNT_PRIMES: TaskFn<(u64, u64), u64> = TaskFn::new("tasks.count_primes");
/// Adds numbers up.
const TOTAL: TaskFn<Vec<u64>, u64> = TaskFn::new("tasks.total");
/// FNV-1a of a byte buffer, and the node it ran on.
const DIGEST: TaskFn<ByteBuf, (u64, String)> = TaskFn::new("tasks.digest");

/// Remote tasks and the object store on a local cluster (or --address): a fan-out of small tasks, a map-reduce over object references, and a broadcast of one large object.
#[derive(Parser)]
struct Args {
    /// Small tasks to fan out.
    #[arg(long, default_value_t = 1000)]
    tasks: u64,
    /// Microseconds of work per small task.
    #[arg(long, default_value_t = 2000)]
    work_us: u64,
    /// Map tasks of the map-reduce.
    #[arg(long, default_value_t = 16)]
    maps: u64,
    /// Size of the broadcast object, MiB.
    #[arg(long, default_value_t = 256)]
    broadcast_mib: usize,
    /// Tasks reading the broadcast object.
    #[arg(long, default_value_t = 8)]
    readers: usize,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn registry() -> Registry {
    Registry::new()
        .task(WORK, |micros: u64| {
            let end = Instant::now() + Duration::from_micros(micros);
            while Instant::now() < end {
                std::hint::spin_loop();
            }
            node_address()
        })
        .task(COUNT_PRIMES, |(start, end): (u64, u64)| {
            Ok::<_, String>((start..end).filter(|n| is_prime(*n)).count() as u64)
        })
        .task(TOTAL, |counts: Vec<u64>| {
            Ok::<_, String>(counts.iter().sum())
        })
        .task(DIGEST, |bytes: ByteBuf| {
            Ok::<_, String>((digest(&bytes), node_address()?))
        })
}

fn node_address() -> Result<String, String> {
    let context = ProcessContext::current().ok_or("not initialised")?;
    Ok(context.home.to_string())
}

fn is_prime(n: u64) -> bool {
    n >= 2 && (2..).take_while(|d| d * d <= n).all(|d| n % d != 0)
}

fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn main() -> Result<()> {
    let (driver, args) =
        nimbus::init_parsed::<Args>(registry(), |_| nimbus::InitOptions::from_args(3))?;
    driver.block_on(async {
        let names = node_names().await?;
        let fan = fan_out(&args, &names).await?;
        let reduce = map_reduce(&args).await?;
        let broadcast = broadcast(&args, &names).await?;
        println!("summary: {fan} {reduce} {broadcast}");
        Ok(())
    })
}

/// Node address → name.
async fn node_names() -> Result<BTreeMap<String, String>> {
    let context = ProcessContext::current().context("connected")?;
    match context.call_head(MembershipRequest::Status).await? {
        MembershipReply::Status(status) => Ok(status
            .nodes
            .iter()
            .map(|n| (n.address.to_string(), n.id.clone()))
            .collect()),
        other => anyhow::bail!("unexpected reply {other:?}"),
    }
}

async fn fan_out(args: &Args, names: &BTreeMap<String, String>) -> Result<String> {
    let started = Instant::now();
    let mut results = Vec::new();
    for _ in 0..args.tasks {
        results
            .push(task::submit(WORK, Input::value(&args.work_us)?, TaskOptions::default()).await?);
    }
    let mut per_node: BTreeMap<String, u64> = BTreeMap::new();
    for result in &results {
        let address = object_store::get(result).await?;
        let name = names.get(&address).cloned().unwrap_or(address);
        *per_node.entry(name).or_default() += 1;
    }
    let per_s = args.tasks as f64 / started.elapsed().as_secs_f64();
    let spread: Vec<String> = per_node.iter().map(|(n, c)| format!("{n}:{c}")).collect();
    println!(
        "fan-out: {} tasks of {} µs in {:.2?} ({per_s:.0} tasks/s); per node: {}",
        args.tasks,
        args.work_us,
        started.elapsed(),
        spread.join(" ")
    );
    Ok(format!(
        "tasks={} tasks_per_s={per_s:.0} nodes_used={}",
        args.tasks,
        per_node.len()
    ))
}

async fn map_reduce(args: &Args) -> Result<String> {
    let span = 50_000;
    let started = Instant::now();
    let mut counts: Vec<ObjectRef<u64>> = Vec::new();
    for i in 0..args.maps {
        let range = (i * span, (i + 1) * span);
        counts
            .push(task::submit(COUNT_PRIMES, Input::value(&range)?, TaskOptions::default()).await?);
    }
    let total = task::submit(TOTAL, Input::gather(&counts), TaskOptions::default()).await?;
    let primes = object_store::get(&total).await?;
    let expected = (0..args.maps * span).filter(|n| is_prime(*n)).count() as u64;
    ensure!(
        primes == expected,
        "map-reduce found {primes} primes, not {expected}"
    );
    println!(
        "map-reduce: {} maps → 1 reduce over their ObjectRefs: {primes} primes below {} in {:.2?}",
        args.maps,
        args.maps * span,
        started.elapsed()
    );
    Ok(format!("primes={primes}"))
}

async fn broadcast(args: &Args, names: &BTreeMap<String, String>) -> Result<String> {
    let size = args.broadcast_mib << 20;
    let (bytes, expected) = tokio::task::spawn_blocking(move || {
        let bytes: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let expected = digest(&bytes);
        (ByteBuf::from(bytes), expected)
    })
    .await?;
    let started = Instant::now();
    let object = object_store::put(&bytes).await?;
    drop(bytes);
    let put_s = started.elapsed().as_secs_f64();
    let nodes: Vec<&String> = names.values().collect();
    let started = Instant::now();
    let mut readers = Vec::new();
    for i in 0..args.readers {
        let options = TaskOptions::default()
            .num_cpus(0.5)
            .strategy(Strategy::Node(nodes[i % nodes.len()].clone()));
        readers.push(task::submit(DIGEST, Input::object(&object), options).await?);
    }
    let mut read_on = BTreeMap::new();
    for reader in &readers {
        let (seen, address) = object_store::get(reader).await?;
        ensure!(seen == expected, "a reader saw other bytes");
        let name = names.get(&address).cloned().unwrap_or(address);
        *read_on.entry(name).or_insert(0) += 1;
    }
    let read_s = started.elapsed().as_secs_f64();
    // One copy per node in the stores, however many readers it had.
    let context = ProcessContext::current().context("connected")?;
    let status = match context.call_head(MembershipRequest::Status).await? {
        MembershipReply::Status(status) => status,
        other => anyhow::bail!("unexpected reply {other:?}"),
    };
    let mut copies = Vec::new();
    let mut total_copies = 0;
    for node in &status.nodes {
        let connection = context
            .endpoint
            .connect(node.address, Some(&node.identity()))
            .await?;
        let listing = nimbus::client::list_objects(&connection).await?;
        let here = listing
            .objects
            .iter()
            .filter(|o| o.id == object.id())
            .count();
        total_copies += here;
        copies.push(format!("{}:{here}", node.id));
    }
    let readers_per_node: Vec<String> = read_on.iter().map(|(n, c)| format!("{n}:{c}")).collect();
    println!(
        "broadcast: {} MiB put in {put_s:.2} s; {} readers ({}) done in {read_s:.2} s; store copies per node: {}",
        args.broadcast_mib,
        args.readers,
        readers_per_node.join(" "),
        copies.join(" ")
    );
    Ok(format!(
        "broadcast_mib={} readers={} store_copies={total_copies} broadcast_read_s={read_s:.2}",
        args.broadcast_mib, args.readers
    ))
}
