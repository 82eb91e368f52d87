//! Load for the dashboard: fills a cluster with idle actors and small
//! objects, then holds them until standard input closes (Ctrl-D), so the
//! dashboard's pages can be looked at (and timed) with that many rows.
//!
//! ```text
//! nimbus start --head
//! make run EXAMPLE=dashboard_load ARGS="--actors 1000 --objects 10000"
//! ```
//!
//! Without `--address` it joins the head started on this machine (or
//! starts a local cluster of its own). Each actor is a worker process
//! holding no CPU. You should see the progress, then `summary:
//! actors=... objects=... spawn_s=... put_s=...` and `holding ...`; the
//! dashboard's Actors page then lists them all, 100 to a page.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::time::Instant;

use actix::prelude::*;
use anyhow::Result;
use clap::Parser;
use futures::stream::{self, StreamExt, TryStreamExt};
use nimbus::actor::{self, RemoteActor, SpawnOptions};
use nimbus::object_store;

/// Does nothing; exists.
struct Idle;

impl Actor for Idle {
    type Context = Context<Self>;
}

impl RemoteActor for Idle {
    const NAME: &'static str = "examples.Idle";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Idle
    }
}

/// How much load.
#[derive(Parser)]
struct Args {
    /// Idle actors to spawn (no CPU each).
    #[arg(long, default_value_t = 1000)]
    actors: usize,
    /// Small objects to put.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Spawns in flight at once.
    #[arg(long, default_value_t = 16)]
    parallel: usize,
    /// Where the cluster is (read by nimbus::init).
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

fn main() -> Result<()> {
    let registry = actor::Registry::new().actor::<Idle>();
    let (driver, args) =
        nimbus::init_parsed::<Args>(registry, |_| nimbus::InitOptions::from_args(2))?;
    // Connects, runs, and on an error keeps the local cluster's node and
    // worker logs and says where.
    driver.block_on(run(&driver, args))
}

async fn run(driver: &nimbus::Driver, args: Args) -> Result<()> {
    println!("cluster at {}", driver.address());
    let started = Instant::now();
    let actors: Vec<_> = stream::iter(0..args.actors)
        .map(|i| async move {
            let options = SpawnOptions::default()
                .num_cpus(0.0)
                .name(format!("idle-{i:05}"));
            let spawned = actor::spawn::<Idle>((), options).await;
            if (i + 1) % 100 == 0 {
                println!("{} actors", i + 1);
            }
            spawned
        })
        .buffer_unordered(args.parallel.max(1))
        .try_collect()
        .await?;
    let spawn_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let mut objects = Vec::with_capacity(args.objects);
    for i in 0..args.objects {
        objects.push(object_store::put(&(i as u64)).await?);
    }
    // Small puts reach the head in the background: the page shows them
    // once they are there.
    object_store::flush().await;
    let put_s = started.elapsed().as_secs_f64();
    println!(
        "summary: actors={} objects={} spawn_s={spawn_s:.1} put_s={put_s:.1}",
        actors.len(),
        objects.len()
    );
    println!("holding the actors and objects until standard input closes (Ctrl-D)");
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await??;
    Ok(())
}
