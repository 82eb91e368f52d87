//! A cluster that grows for its work and shrinks after it: actors that
//! ask for more CPUs than the cluster has wait while the autoscaler
//! launches nodes for them.
//!
//! ```text
//! nimbus up examples/autoscale/local.toml      # a head offering no CPUs, an autoscaler
//! make run EXAMPLE=autoscale ARGS="--actors 2 --cpus 2"
//! make run EXAMPLE=autoscale ARGS="--actors 0 --cpus 1 --spread 3"   # a node per bundle
//! make run EXAMPLE=autoscale ARGS="--actors 0 --request 2 --hold"    # room ahead of use
//! make run EXAMPLE=autoscale ARGS="--actors 0 --tasks 8"   # tasks wait for nodes too
//! nimbus status                                # the cpu-2 nodes, idle, until idle_timeout_s
//! nimbus down examples/autoscale/local.toml
//! ```
//!
//! The program joins the head started on this machine. Its actors are
//! spawned together; each waits (a pending demand in `nimbus status`)
//! until a node the autoscaler launched for it joins. You should see each
//! actor's node and how long its spawn waited, then a last `summary:`
//! line with `actors=2 nodes=2`; with `--spread 3`, a placement group
//! whose three bundles must each have a node of its own waits for three
//! (`group_nodes=3`). With `--tasks 8`, eight tasks of `--cpus` each
//! (holding them for `--task-ms`) wait for nodes the same way
//! (`task_nodes=2`: the autoscaler launches up to its limit for them). With `--request 2`, it first asks the autoscaler
//! for room for two bundles of `--cpus` (`request_resources`): two nodes
//! are launched before any spawn waits, and kept while the request stands
//! (idle past `idle_timeout_s` with `--hold`); the program clears it as it
//! ends. Once the program has ended the nodes are idle, and the
//! autoscaler stops them after the config's `idle_timeout_s`.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::Result;
use clap::Parser;
use nimbus::actor::{self, RemoteActor, RemoteMessage, SpawnOptions, Strategy};
use nimbus::cluster::{ResourceSet, CPU};
use nimbus::object_store;
use nimbus::placement::{PlacementGroup, PlacementStrategy};
use nimbus::task::{self, Input, TaskFn, TaskOptions};
use serde::{Deserialize, Serialize};

/// Says where it runs.
struct Placed;

impl Actor for Placed {
    type Context = Context<Self>;
}

impl RemoteActor for Placed {
    const NAME: &'static str = "examples.Placed";
    type Args = ();

    fn from_args((): ()) -> Self {
        Placed
    }
}

/// The node the actor runs on.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "String")]
struct Where;

impl RemoteMessage for Where {
    const NAME: &'static str = "examples.Where";
}

impl Handler<Where> for Placed {
    type Result = String;

    fn handle(&mut self, _: Where, _: &mut Context<Self>) -> String {
        actor::this_worker().map_or_else(|| "this process".into(), |me| me.node.name.clone())
    }
}

/// Holds its CPUs for the milliseconds given, then says which node it ran on.
const HOLD: TaskFn<u64, String> = TaskFn::new("examples.autoscale.hold");

/// Actors that need nodes the cluster does not have yet.
#[derive(Parser)]
struct Args {
    /// How many actors to spawn at once.
    #[arg(long, default_value_t = 2)]
    actors: usize,
    /// CPUs each actor holds.
    #[arg(long, default_value_t = 2.0)]
    cpus: f64,
    /// Seconds each spawn may wait for a node.
    #[arg(long, default_value_t = 60)]
    wait_s: u64,
    /// Keep the actors after the summary until standard input closes
    /// (Ctrl-D), to watch the nodes they hold with `nimbus status`.
    #[arg(long)]
    hold: bool,
    /// Then reserve a STRICT_SPREAD placement group of this many bundles
    /// of --cpus each (every bundle on a node of its own).
    #[arg(long, default_value_t = 0)]
    spread: usize,
    /// Then run this many tasks of --cpus each.
    #[arg(long, default_value_t = 0)]
    tasks: usize,
    /// How long each task holds its CPUs, in milliseconds.
    #[arg(long, default_value_t = 500)]
    task_ms: u64,
    /// First ask the autoscaler for room for this many bundles of --cpus
    /// (cleared as the program ends).
    #[arg(long, default_value_t = 0)]
    request: usize,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn main() -> Result<()> {
    let registry = actor::Registry::new()
        .actor::<Placed>()
        .message::<Placed, Where>()
        .task(HOLD, |millis: u64| {
            std::thread::sleep(Duration::from_millis(millis));
            actor::this_worker()
                .map(|me| me.node.name.clone())
                .ok_or_else(|| "not in a worker".to_string())
        });
    // The head started on this machine (`nimbus up`), else a local
    // cluster of its own, which does not grow.
    let (driver, args) =
        nimbus::init_parsed::<Args>(registry, |_| nimbus::InitOptions::from_args(2))?;
    driver.block_on(run(&args))
}

async fn run(args: &Args) -> Result<()> {
    if args.request > 0 {
        let bundles = vec![ResourceSet::of(CPU, args.cpus); args.request];
        nimbus::autoscaler::request_resources(bundles).await?;
        println!("requested room for {} × CPU={}", args.request, args.cpus);
    }
    let started = Instant::now();
    let spawns = (0..args.actors).map(|_| async {
        let options = SpawnOptions::default()
            .num_cpus(args.cpus)
            .strategy(Strategy::Spread)
            .deadline(Duration::from_secs(args.wait_s));
        let handle = actor::spawn::<Placed>((), options).await?;
        let waited = started.elapsed();
        let node = handle.send(Where).await?;
        anyhow::Ok((handle, node, waited))
    });
    let placed = futures::future::try_join_all(spawns).await?;
    let mut nodes = BTreeSet::new();
    let mut longest = Duration::ZERO;
    for (i, (_, node, waited)) in placed.iter().enumerate() {
        println!(
            "actor {i} ({} CPUs) on {node} after {:.2} s",
            args.cpus,
            waited.as_secs_f64()
        );
        nodes.insert(node.clone());
        longest = longest.max(*waited);
    }
    let mut group_nodes = BTreeSet::new();
    if args.spread > 0 {
        let started = Instant::now();
        let group = PlacementGroup::create(
            vec![ResourceSet::of(CPU, args.cpus); args.spread],
            PlacementStrategy::StrictSpread,
            Duration::from_secs(args.wait_s),
        )
        .await?;
        for i in 0..group.len() {
            group_nodes.insert(group.node(i)?.to_string());
        }
        println!(
            "a STRICT_SPREAD group of {} bundles on {} after {:.2} s",
            args.spread,
            group_nodes.iter().cloned().collect::<Vec<_>>().join(", "),
            started.elapsed().as_secs_f64()
        );
        group.remove().await?;
    }
    let task_nodes = run_tasks(args).await?;
    println!(
        "summary: actors={} nodes={} longest_wait_s={:.2} group_nodes={} tasks={} task_nodes={}",
        placed.len(),
        nodes.len(),
        longest.as_secs_f64(),
        group_nodes.len(),
        args.tasks,
        task_nodes.len()
    );
    if args.hold {
        tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
            .await??;
    }
    for (handle, _, _) in &placed {
        handle.kill().await?;
    }
    if args.request > 0 {
        nimbus::autoscaler::request_resources(Vec::new()).await?;
    }
    Ok(())
}

/// Runs `--tasks` tasks of `--cpus` each: the nodes they ran on.
async fn run_tasks(args: &Args) -> Result<BTreeSet<String>> {
    let mut nodes = BTreeSet::new();
    if args.tasks == 0 {
        return Ok(nodes);
    }
    let started = Instant::now();
    let options = TaskOptions::default().num_cpus(args.cpus);
    let mut results = Vec::new();
    for _ in 0..args.tasks {
        results.push(task::submit(HOLD, Input::value(&args.task_ms)?, options.clone()).await?);
    }
    for result in &results {
        nodes.insert(object_store::get(result).await?);
    }
    println!(
        "{} tasks ({} CPUs each) on {} after {:.2} s",
        args.tasks,
        args.cpus,
        nodes.iter().cloned().collect::<Vec<_>>().join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(nodes)
}
