//! The test runner of the user-program test binaries (`tests/actors`,
//! `nimbus-train/tests/train`, `nimbus-rl/tests/rl`): they have no libtest harness, because a
//! worker process started from the binary must reach `nimbus::init` first.
//! `run` executes every test in turn under a deadline on the driver's actix
//! system, prints libtest-like lines, and exits non-zero if any failed or
//! if the driver's local cluster leaves a node or worker process behind.
//! With [`Leaves::NothingInUse`], a test also fails if the resources it
//! took (CPUs, GPUs, memory) are not all free again within [`SETTLE_WAIT`]
//! of its end, naming what is held on which node and the actors alive: a
//! leak is reported by the test that made it, not by a later one that
//! cannot be placed.
//! Arguments that do not start with `-` select tests by substring.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::FutureExt;

/// How long the local cluster's processes get to be gone after it is dropped.
const LEAK_WAIT: Duration = Duration::from_secs(15);
/// How long a test's resources get to be free again after it ends (more
/// than Serve's 30 s drain of a replica it scaled down).
const SETTLE_WAIT: Duration = Duration::from_secs(40);

/// What each test may leave in the driver's local cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // each binary that includes this file names one of them
pub enum Leaves {
    /// Anything: later tests build on what earlier ones left.
    Anything,
    /// No resource in use once the test is over.
    NothingInUse,
}

/// One test: an async function of the connected driver.
pub type Test = fn(&mut nimbus::Driver) -> Pin<Box<dyn Future<Output = ()> + '_>>;

/// Boxes a test body.
pub fn boxed<'a>(test: impl Future<Output = ()> + 'a) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
    Box::pin(test)
}

/// Connects `driver`, runs the selected `tests`, each within `deadline`
/// and leaving what `leaves` allows, calls `cleanup` (whatever the
/// outcome), then exits with the outcome.
pub fn run(
    mut driver: nimbus::Driver,
    tests: &[(&str, Test)],
    deadline: Duration,
    leaves: Leaves,
    cleanup: impl FnOnce(),
) -> ! {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let system = actix::System::new();
    let failed = system.block_on(async {
        driver.connect().await.expect("the driver connects");
        let mut failed = Vec::new();
        for (name, test) in tests {
            if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
                continue;
            }
            let started = Instant::now();
            let run =
                AssertUnwindSafe(tokio::time::timeout(deadline, test(&mut driver))).catch_unwind();
            let mut outcome = match run.await {
                Ok(Ok(())) => None,
                Ok(Err(_)) => Some(("TIMED OUT", format!("ran past its {deadline:?} deadline"))),
                Err(panic) => Some(("FAILED", panic_message(panic.as_ref()))),
            };
            if outcome.is_none() && leaves == Leaves::NothingInUse {
                if let Err(held) = nothing_in_use(&mut driver).await {
                    outcome = Some(("FAILED", held));
                }
            }
            let took = started.elapsed();
            match outcome {
                None => println!("test {name} ... ok ({took:.1?})"),
                Some((verdict, why)) => {
                    println!("test {name} ... {verdict} ({took:.1?})");
                    failed.push(format!("{name}: {why}"));
                }
            }
        }
        failed
    });
    let watch = driver
        .local_cluster()
        .map(|cluster| nimbus::testing::ExitWatch::cluster(cluster));
    drop(driver);
    cleanup();
    let mut failed = failed;
    if let Some(Err(left)) = watch.map(|watch| watch.wait(LEAK_WAIT)) {
        eprintln!("{left}");
        failed.push("processes left behind".into());
    }
    if !failed.is_empty() {
        // Each with its reason: the end of the output is what a CI log
        // shows, far from the panic among the workers' lines.
        for failure in &failed {
            eprintln!("failed: {failure}");
        }
        std::process::exit(1);
    }
    println!("test result: ok");
    std::process::exit(0)
}

/// Waits until no node of the local cluster has a resource in use; else
/// says what is held where, and which actors are alive.
async fn nothing_in_use(driver: &mut nimbus::Driver) -> Result<(), String> {
    let Some(cluster) = driver.local_cluster() else {
        return Ok(()); // a cluster of someone else's: not ours to judge
    };
    let client = cluster.client().await.map_err(|e| e.to_string())?;
    let idle = |status: &nimbus::cluster::ClusterStatus| {
        status
            .alive()
            .all(|node| node.resources.used.iter().all(|(_, amount)| amount <= 1e-9))
    };
    let waited = client
        .wait_for_status("its resources free again", SETTLE_WAIT, idle)
        .await;
    let Err(error) = waited else {
        return Ok(());
    };
    let held: Vec<String> = match client.status().await {
        Ok(status) => status
            .alive()
            .map(|node| format!("{} uses {}", node.id, node.resources.used))
            .collect(),
        Err(e) => vec![format!("(the status could not be read: {e})")],
    };
    let alive: Vec<String> = match client.actors().await {
        Ok(actors) => actors
            .iter()
            .filter(|actor| actor.dead.is_none())
            .map(|actor| format!("{} {} on {}", actor.actor, actor.type_name, actor.node.name))
            .collect(),
        Err(e) => vec![format!("(the actors could not be listed: {e})")],
    };
    Err(format!(
        "{error}: {}; actors alive: {}",
        held.join("; "),
        alive.join(", ")
    ))
}

/// What a test panicked with (an assertion's message, say).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(message), _) => message.clone(),
        (None, Some(message)) => message.to_string(),
        (None, None) => "a panic without a message".to_string(),
    }
}
