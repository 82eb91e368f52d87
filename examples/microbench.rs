//! Microbenchmarks of nimbus' building blocks, printed as `name: value unit`
//! lines, in parts: `tasks`, `actor_calls`, `objects` and
//! `placement_groups`.
//!
//! ```text
//! make run EXAMPLE=microbench                          # every part
//! make run EXAMPLE=microbench ARGS="--only actor_calls"
//! ```
//!
//! `placement_groups_per_s` is placement-group create + remove cycles per
//! second (one bundle of 0.1 CPU), as in Ray's microbenchmark: 2,000 of
//! them, each four round trips (the latest event's number and the nodes'
//! status from the head, the bundle's reservation and release at its
//! node), so the figure is the price of cross-process wake-ups. On a
//! virtual machine that depends on where the scheduler puts the processes
//! for the run: on the 2-core development machine about 13.8k/s with all
//! of them on one core (`taskset -c 0`), about 8.6k/s on two, where each
//! wake-up interrupts the other core.
//!
//! `objects`: `put_calls_per_s` and `get_calls_per_s` (small values, one at
//! a time, from this process to its home node's store; a small put returns
//! once queued and gets of small objects this process put are served from
//! its own copy, as Ray's in-process store does),
//! `put_calls_delivered_per_s` (the same puts, timed until the last
//! reached the node: `object_store::flush`),
//! `get_calls_other_process_per_s` (the same objects read once by a worker
//! process of the same node: a round trip each), `put_gb_per_s` (800 MiB
//! written as 100 MiB objects), `put_zeros_gb_per_s` (Ray's "single client
//! put gigabytes": an 800 MiB array of zeros that was never written, put
//! whole; reading such an array reads one page of zeros over and over,
//! which is why this figure can pass a memory copy's speed) and
//! `cross_node_gb_per_s` (a 256 MiB object pulled by another node).
//!
//! Every path is warmed up (a tenth of its calls) before it is measured.
//!
//! It starts a 2-node local cluster and measures, for 64 B and 1 MiB
//! messages, synchronous calls (one in flight: latency p50/p99 and calls/s)
//! and pipelined calls (many in flight: calls/s):
//! - `driver_to_worker`: this process calling an actor in a worker process
//!   on the same host (the same-host Unix-domain socket the QUIC
//!   handshake admits calls to);
//! - `across_nodes`: an actor in a worker process of the head node calling
//!   an actor in a worker process of node-1 (two nodes of this machine, so
//!   the same-host socket between two worker processes);
//! - `same_process`: an actix actor called in this process, for reference.
//!
//! `actor_calls_sync_per_s` and `actor_calls_async_per_s` are the 64 B
//! figures of `driver_to_worker` (1:1, caller and actor in different
//! processes), the shape of Ray's 1:1 actor call benchmarks.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{Context as _, Result};
use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use nimbus::actor::{self, ActorHandle, RemoteActor, RemoteMessage, SpawnOptions, Strategy};
use nimbus::cluster::NodeStatus;
use nimbus::object_store;
use nimbus::placement::{PlacementGroup, PlacementStrategy};
use nimbus::task::{self, Input, TaskFn, TaskOptions};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Calls per measurement: (payload, sync calls, pipelined calls).
const SIZES: [(usize, &str, usize, usize); 2] =
    [(64, "64B", 5_000, 50_000), (1 << 20, "1MiB", 200, 1_000)];
/// Calls in flight when pipelining.
const WINDOW: usize = 128;

/// Echoes payloads.
struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

impl RemoteActor for Echo {
    const NAME: &'static str = "microbench.Echo";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Echo
    }
}

/// Byte payloads travel as MessagePack `bin` (`serde_bytes`), not as an
/// array of numbers: that is what makes 1 MiB messages cheap.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "ByteBuf")]
struct Ping(#[serde(with = "serde_bytes")] Vec<u8>);

impl RemoteMessage for Ping {
    const NAME: &'static str = "microbench.Ping";
}

impl Handler<Ping> for Echo {
    type Result = MessageResult<Ping>;
    fn handle(&mut self, Ping(payload): Ping, _: &mut Context<Self>) -> Self::Result {
        MessageResult(ByteBuf::from(payload))
    }
}

/// Runs a measurement from inside a worker process.
struct Caller;

impl Actor for Caller {
    type Context = Context<Self>;
}

impl RemoteActor for Caller {
    const NAME: &'static str = "microbench.Caller";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Caller
    }
}

/// Measure calls to `target`.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Figures, String>")]
struct Measure {
    target: ActorHandle<Echo>,
    payload: usize,
    calls: usize,
    window: usize,
}

impl RemoteMessage for Measure {
    const NAME: &'static str = "microbench.Measure";
}

impl Handler<Measure> for Caller {
    type Result = ResponseFuture<Result<Figures, String>>;
    fn handle(&mut self, m: Measure, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            measure(
                |p| bytes(m.target.send(Ping(p))),
                m.payload,
                m.calls,
                m.window,
            )
            .await
            .map_err(|e| e.to_string())
        })
    }
}

/// Get every object once (none is in this process's memory yet) and
/// return the rate.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<f64, String>")]
struct MeasureGets(Vec<object_store::ObjectRef<u64>>);

impl RemoteMessage for MeasureGets {
    const NAME: &'static str = "microbench.MeasureGets";
}

impl Handler<MeasureGets> for Caller {
    type Result = ResponseFuture<Result<f64, String>>;
    fn handle(&mut self, MeasureGets(refs): MeasureGets, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let started = Instant::now();
            for object in &refs {
                object_store::get(object).await.map_err(|e| e.to_string())?;
            }
            Ok(refs.len() as f64 / started.elapsed().as_secs_f64())
        })
    }
}

/// What one measurement found.
#[derive(Debug, Serialize, Deserialize)]
struct Figures {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// `calls` calls of `call`, `window` in flight at a time.
async fn measure<F, E>(
    call: impl Fn(Vec<u8>) -> F,
    payload: usize,
    calls: usize,
    window: usize,
) -> Result<Figures>
where
    F: std::future::Future<Output = Result<Vec<u8>, E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let mut latencies = Histogram::<u64>::new(3)?;
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut issued = 0;
    while issued < calls || !in_flight.is_empty() {
        while issued < calls && in_flight.len() < window {
            let sent = Instant::now();
            let reply = call(vec![0x5a; payload]);
            in_flight.push(async move { (reply.await, sent.elapsed()) });
            issued += 1;
        }
        if let Some((reply, latency)) = in_flight.next().await {
            anyhow::ensure!(reply?.len() == payload, "echo changed the payload");
            latencies.record(latency.as_nanos() as u64)?;
        }
    }
    Ok(Figures {
        per_s: calls as f64 / started.elapsed().as_secs_f64(),
        p50_us: latencies.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: latencies.value_at_quantile(0.99) as f64 / 1e3,
    })
}

/// The reply's bytes.
async fn bytes<E>(
    reply: impl std::future::Future<Output = Result<ByteBuf, E>>,
) -> Result<Vec<u8>, E> {
    reply.await.map(ByteBuf::into_vec)
}

fn print(name: &str, sync: &Figures, pipelined: &Figures) {
    println!("{name}_sync_per_s: {:.0} calls/s", sync.per_s);
    println!("{name}_sync_p50: {:.1} us", sync.p50_us);
    println!("{name}_sync_p99: {:.1} us", sync.p99_us);
    println!("{name}_pipelined_per_s: {:.0} calls/s", pipelined.per_s);
}

/// The task of the task rates: returns its argument.
const IDENTITY: TaskFn<u64, u64> = TaskFn::new("microbench.identity");

fn registry() -> actor::Registry {
    actor::Registry::new()
        .task(IDENTITY, |x: u64| Ok::<_, String>(x))
        .actor::<Echo>()
        .message::<Echo, Ping>()
        .actor::<Caller>()
        .message::<Caller, Measure>()
        .message::<Caller, MeasureGets>()
}

/// Microbenchmarks of nimbus' building blocks, as `name: value unit` lines.
#[derive(clap::Parser)]
struct Args {
    /// Run one part only.
    #[arg(long, value_parser = ["tasks", "actor_calls", "objects", "placement_groups"])]
    only: Option<String>,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn main() -> Result<()> {
    let (driver, args) = nimbus::init_parsed::<Args>(registry(), |args| {
        nimbus::InitOptions::private(args.cluster.nodes.unwrap_or(2))
    })?;
    let only = args.only;
    let wanted = |part: &str| only.as_deref().is_none_or(|o| o == part);
    actix::System::new().block_on(async {
        driver.connect().await?;
        let mut summary = Vec::new();
        if wanted("tasks") {
            summary.push(tasks().await?);
        }
        if wanted("actor_calls") {
            summary.push(actor_calls().await?);
        }
        if wanted("objects") {
            summary.push(objects().await?);
        }
        if wanted("placement_groups") {
            summary.push(placement_groups().await?);
        }
        println!("summary: {}", summary.join(" "));
        Ok(())
    })
}

/// `tasks_sync_per_s`: submit one task and get its result, one at a time;
/// `tasks_async_per_s`: submit bursts of 5,000, then get them all. Tiny
/// tasks of 1 CPU each (as Ray's), after warming the worker pool up.
///
/// The first burst grows the pool to one worker per CPU (four here; the
/// warm-up and the sync calls need two), so it is reported on its own as
/// `tasks_async_first_burst_per_s`; `tasks_async_per_s` is the rate of the
/// next [`BURSTS`] bursts, as Ray's `timeit` warms up on the same call
/// before it measures.
async fn tasks() -> Result<String> {
    let options = TaskOptions::default;
    let run = |i: u64| async move {
        let result = task::submit(IDENTITY, Input::value(&i)?, options()).await?;
        anyhow::Ok(result)
    };
    let warm: Vec<_> = futures::future::try_join_all((0..64).map(run)).await?;
    for (i, result) in warm.iter().enumerate() {
        anyhow::ensure!(object_store::get(result).await? == i as u64);
    }
    let calls = 1_000;
    let started = Instant::now();
    for i in 0..calls {
        let result = run(i).await?;
        anyhow::ensure!(object_store::get(&result).await? == i);
    }
    let sync_per_s = calls as f64 / started.elapsed().as_secs_f64();
    let burst = || async move {
        let results = futures::future::try_join_all((0..5_000).map(run)).await?;
        for (i, result) in results.iter().enumerate() {
            anyhow::ensure!(object_store::get(result).await? == i as u64);
        }
        anyhow::Ok(results.len())
    };
    let started = Instant::now();
    let first_burst_per_s = burst().await? as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut calls = 0;
    for _ in 0..BURSTS {
        calls += burst().await?;
    }
    let async_per_s = calls as f64 / started.elapsed().as_secs_f64();
    println!("tasks_sync_per_s: {sync_per_s:.0} tasks/s");
    println!("tasks_async_per_s: {async_per_s:.0} tasks/s");
    println!("tasks_async_first_burst_per_s: {first_burst_per_s:.0} tasks/s");
    Ok(format!(
        "tasks_sync_per_s={sync_per_s:.0} tasks_async_per_s={async_per_s:.0} tasks_async_first_burst_per_s={first_burst_per_s:.0}"
    ))
}

/// Bursts of tasks `tasks_async_per_s` times, after the first.
const BURSTS: usize = 4;

/// Puts of 800 MiB `put_zeros_gb_per_s` times, after the first.
const ZERO_PUTS: usize = 4;

async fn objects() -> Result<String> {
    let calls = 2_000;
    for i in 0..calls / 10 {
        let warm = object_store::put(&(i as u64)).await?;
        object_store::get(&warm).await?;
    }
    let started = Instant::now();
    let mut refs = Vec::with_capacity(calls);
    for i in 0..calls {
        refs.push(object_store::put(&(i as u64)).await?);
    }
    let put_per_s = calls as f64 / started.elapsed().as_secs_f64();
    object_store::flush().await;
    let delivered_per_s = calls as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    for object in &refs {
        object_store::get(object).await?;
    }
    let get_per_s = calls as f64 / started.elapsed().as_secs_f64();
    // The same objects read by another process of the same node, which
    // has no copy of them yet: one round trip each.
    let (head, member) = head_and_member().await?;
    let reader = actor::spawn::<Caller>(
        (),
        SpawnOptions::default()
            .num_cpus(0.1)
            .strategy(Strategy::Node(head.id)),
    )
    .await?;
    let cold_get_per_s = reader
        .send(MeasureGets(refs.clone()))
        .await?
        .map_err(anyhow::Error::msg)?;
    reader.kill().await?;

    let block = vec![0x5au8; 100 << 20];
    drop(object_store::put_bytes(&block).await?);
    let started = Instant::now();
    for _ in 0..8 {
        object_store::put_bytes(&block).await?;
    }
    let put_gb_per_s = (8 * block.len()) as f64 / started.elapsed().as_secs_f64() / 1e9;
    drop(block);
    // Ray's figure, the same way: one 800 MiB array of zeros never
    // written (numpy's `np.zeros`; the kernel backs its pages with one
    // page of zeros until written), put whole, again and again, after
    // warming up until the store reuses freed files (as Ray's `timeit`
    // warms up for a second): puts in a row write into two files in
    // turn, as each one's file is freed while the next put starts.
    let zeros = vec![0u8; 800 << 20];
    for _ in 0..2 {
        drop(object_store::put_bytes(&zeros).await?);
    }
    let started = Instant::now();
    for _ in 0..ZERO_PUTS {
        object_store::put_bytes(&zeros).await?;
    }
    let put_zeros_gb_per_s =
        (ZERO_PUTS * zeros.len()) as f64 / started.elapsed().as_secs_f64() / 1e9;
    drop(zeros);

    let big = object_store::put_bytes(&vec![0xa5u8; 256 << 20]).await?;
    let context = actor::ProcessContext::current().expect("connected");
    let node = member;
    let connection = context
        .endpoint
        .connect(node.address, Some(&node.identity()))
        .await?;
    let pull = nimbus::cluster::ObjectRequest::PullObject {
        id: big.id(),
        owner: big.owner().clone(),
        wait_ms: 0,
    };
    let started = Instant::now();
    let pulled =
        nimbus::client::call(&connection, pull, nimbus::transport::RequestOptions::bulk()).await?;
    let elapsed = started.elapsed();
    match pulled {
        nimbus::cluster::ObjectReply::Ready { size, .. } if size == 256 << 20 => {}
        other => anyhow::bail!("node-1 did not pull the 256 MiB object: {other:?}"),
    }
    let cross_node_gb_per_s = (256 << 20) as f64 / elapsed.as_secs_f64() / 1e9;

    println!("put_calls_per_s: {put_per_s:.0} calls/s");
    println!("put_calls_delivered_per_s: {delivered_per_s:.0} calls/s");
    println!("get_calls_per_s: {get_per_s:.0} calls/s");
    println!("get_calls_other_process_per_s: {cold_get_per_s:.0} calls/s");
    println!("put_gb_per_s: {put_gb_per_s:.2} GB/s");
    println!("put_zeros_gb_per_s: {put_zeros_gb_per_s:.2} GB/s");
    println!("cross_node_gb_per_s: {cross_node_gb_per_s:.2} GB/s");
    Ok(format!(
        "put_calls_per_s={put_per_s:.0} put_calls_delivered_per_s={delivered_per_s:.0} get_calls_per_s={get_per_s:.0} get_calls_other_process_per_s={cold_get_per_s:.0} put_gb_per_s={put_gb_per_s:.2} put_zeros_gb_per_s={put_zeros_gb_per_s:.2} cross_node_gb_per_s={cross_node_gb_per_s:.2}"
    ))
}

async fn placement_groups() -> Result<String> {
    let bundle = nimbus::cluster::ResourceSet::of("CPU", 0.1);
    let cycles = 2_000;
    let cycle = || async {
        let group = PlacementGroup::create(
            vec![bundle.clone()],
            PlacementStrategy::Pack,
            Duration::from_secs(10),
        )
        .await?;
        group.remove().await
    };
    for _ in 0..cycles / 10 {
        cycle().await?;
    }
    let started = Instant::now();
    for _ in 0..cycles {
        cycle().await?;
    }
    let per_s = cycles as f64 / started.elapsed().as_secs_f64();
    println!("placement_groups_per_s: {per_s:.0} groups/s");
    Ok(format!("placement_groups_per_s={per_s:.0}"))
}

/// The head and a member of the cluster (the last alive node that is not
/// the head, else the head), looked up: node names differ between
/// clusters.
async fn head_and_member() -> Result<(NodeStatus, NodeStatus)> {
    let context = actor::ProcessContext::current().expect("connected");
    let status = match context
        .call_head(nimbus::cluster::MembershipRequest::Status)
        .await?
    {
        nimbus::cluster::MembershipReply::Status(status) => status,
        other => anyhow::bail!("unexpected reply {other:?}"),
    };
    let alive: Vec<&NodeStatus> = status.alive().collect();
    let head = alive.iter().find(|n| n.head).context("the head is alive")?;
    let member = alive.iter().rev().find(|n| !n.head).unwrap_or(head);
    Ok(((*head).clone(), (*member).clone()))
}

async fn actor_calls() -> Result<String> {
    let on = |node: &str| {
        SpawnOptions::default()
            .num_cpus(0.1)
            .strategy(Strategy::Node(node.into()))
    };
    let (head, member) = head_and_member().await?;
    let echo = actor::spawn::<Echo>((), on(&member.id)).await?;
    let caller = actor::spawn::<Caller>((), on(&head.id)).await?;
    let local = Echo.start();
    let mut summary = Vec::new();
    for (payload, label, sync_calls, pipelined_calls) in SIZES {
        let remote = |p| bytes(echo.send(Ping(p)));
        measure(remote, payload, sync_calls / 10, 1).await?;
        let sync = measure(remote, payload, sync_calls, 1).await?;
        let pipelined = measure(remote, payload, pipelined_calls, WINDOW).await?;
        print(
            &format!("actor_calls_driver_to_worker_{label}"),
            &sync,
            &pipelined,
        );
        if payload == 64 {
            println!("actor_calls_sync_per_s: {:.0} calls/s", sync.per_s);
            println!("actor_calls_async_per_s: {:.0} calls/s", pipelined.per_s);
            summary.push(format!(
                "actor_calls_sync_per_s={:.0} actor_calls_async_per_s={:.0}",
                sync.per_s, pipelined.per_s
            ));
        }

        let across = |calls, window| Measure {
            target: echo.clone(),
            payload,
            calls,
            window,
        };
        caller
            .send(across(sync_calls / 10, 1))
            .await?
            .map_err(anyhow::Error::msg)?;
        let sync = caller
            .send(across(sync_calls, 1))
            .await?
            .map_err(anyhow::Error::msg)?;
        let pipelined = caller
            .send(across(pipelined_calls, WINDOW))
            .await?
            .map_err(anyhow::Error::msg)?;
        print(
            &format!("actor_calls_across_nodes_{label}"),
            &sync,
            &pipelined,
        );

        let same = |p| {
            let reply = local.send(Ping(p));
            async move { reply.await.map(ByteBuf::into_vec).map_err(MailboxFailure) }
        };
        measure(same, payload, sync_calls / 10, 1).await?;
        let sync = measure(same, payload, sync_calls, 1).await?;
        let pipelined = measure(same, payload, pipelined_calls, WINDOW).await?;
        print(
            &format!("actor_calls_same_process_{label}"),
            &sync,
            &pipelined,
        );
    }
    Ok(summary.join(" "))
}

/// actix's `MailboxError` as a `std::error::Error` with `'static` bounds.
#[derive(Debug)]
struct MailboxFailure(actix::MailboxError);

impl std::fmt::Display for MailboxFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for MailboxFailure {}
