//! The test runner of the user-program test binaries (`tests/actors`,
//! `nimbus-train/tests/train`, `nimbus-rl/tests/rl`): they have no libtest harness, because a
//! worker process started from the binary must reach `nimbus::init` first.
//! `run` executes every test in turn under a deadline on the driver's actix
//! system, prints libtest-like lines, and exits non-zero if any failed or
//! if the driver's local cluster leaves a node or worker process behind.
//! Arguments that do not start with `-` select tests by substring.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::FutureExt;

/// How long the local cluster's processes get to be gone after it is dropped.
const LEAK_WAIT: Duration = Duration::from_secs(15);

/// One test: an async function of the connected driver.
pub type Test = fn(&mut nimbus::Driver) -> Pin<Box<dyn Future<Output = ()> + '_>>;

/// Boxes a test body.
pub fn boxed<'a>(test: impl Future<Output = ()> + 'a) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
    Box::pin(test)
}

/// Connects `driver`, runs the selected `tests`, each within `deadline`,
/// calls `cleanup` (whatever the outcome), then exits with the outcome.
pub fn run(
    mut driver: nimbus::Driver,
    tests: &[(&str, Test)],
    deadline: Duration,
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
            let outcome = match run.await {
                Ok(Ok(())) => None,
                Ok(Err(_)) => Some(("TIMED OUT", format!("ran past its {deadline:?} deadline"))),
                Err(panic) => Some(("FAILED", panic_message(panic.as_ref()))),
            };
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

/// What a test panicked with (an assertion's message, say).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(message), _) => message.clone(),
        (None, Some(message)) => message.to_string(),
        (None, None) => "a panic without a message".to_string(),
    }
}
