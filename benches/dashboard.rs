//! What the dashboard costs and how fast it answers, on a cluster started
//! with the CLI (a head and `node-1`) on this machine:
//!
//! - `head_cpu_s_dashboard_closed` / `_open`: the head process's CPU time
//!   (user + system, from `/proc`) while `microbench --only actor_calls`
//!   runs against the cluster, without and then with a headless Chromium
//!   showing the dashboard's cluster page (live updates on), and their
//!   ratio (medians of 5 runs each, alternating);
//! - `dashboard_actors_page_load_ms` / `dashboard_objects_page_load_ms`:
//!   from navigating to the page to its first 100 rows shown, with
//!   `dashboard_load`'s actors and objects in the cluster (median of 5).
//!
//! ```text
//! cargo build --release --bins --examples
//! NIMBUS_BENCH_ACTORS=1000 NIMBUS_BENCH_OBJECTS=10000 cargo bench --bench dashboard
//! ```
//!
//! `dashboard_load` links no libtorch (nothing of the `nimbus` crate
//! does): a worker of a binary linked with libtorch costs ~60 MiB (300 of
//! them filled 18 GiB here), and 1,000 would not fit in 24 GiB.
//!
//! Under `cargo test` (no `--bench`) it runs small (20 actors, 200
//! objects, no microbench). Needs Chromium (`NIMBUS_CHROMIUM`, default
//! /usr/bin/chromium); without it, it says so and measures nothing.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[path = "../tests/common/browser.rs"]
#[allow(
    dead_code,
    reason = "clicks, typing and screenshots are the tests' own"
)]
mod browser;

use browser::Browser;

/// The longest the load may take to be in place.
const LOAD_DEADLINE: Duration = Duration::from_secs(900);
/// The longest a page may take to show its rows.
const PAGE_DEADLINE: Duration = Duration::from_secs(60);
/// The same under `cargo test` (20 actors): a page kept waiting for a
/// connection, as pages in the back-forward cache holding their event
/// streams once did (60 s on the seventh load), fails the test run.
const TEST_PAGE_DEADLINE: Duration = Duration::from_secs(20);
/// Microbench runs with the dashboard closed, and as many open.
const CPU_ROUNDS: usize = 5;

fn nimbus(home: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(args)
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nimbus {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn line(out: &Output, prefix: &str) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(prefix).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {prefix:?} line"))
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_nimbus"))
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

/// The head's process id, from the record `nimbus start` keeps.
fn head_pid(home: &Path, head: &str) -> u32 {
    for entry in std::fs::read_dir(home.join("nodes")).unwrap() {
        let record: serde_json::Value =
            serde_json::from_slice(&std::fs::read(entry.unwrap().path()).unwrap()).unwrap();
        if record["name"] == head {
            return record["pid"].as_u64().unwrap() as u32;
        }
    }
    panic!("no record of the head {head}");
}

/// User + system CPU seconds of process `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    // Fields 14 and 15 of stat (utime, stime), counted from the state (3).
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// Runs the microbench's actor calls against `head`; the head's CPU
/// seconds meanwhile.
fn head_cpu_during_microbench(home: &Path, head: &str, pid: u32) -> f64 {
    let before = cpu_seconds(pid);
    let out = Command::new(example("microbench"))
        .args(["--only", "actor_calls", "--address", head])
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cpu_seconds(pid) - before
}

/// `dashboard_load` holding its actors and objects until dropped.
struct Load(Child);

impl Load {
    fn start(home: &Path, head: &str, actors: usize, objects: usize) -> Load {
        let child = Command::new(example("dashboard_load"))
            .args(["--address", head, "--actors", &actors.to_string()])
            .args(["--objects", &objects.to_string()])
            .env("NIMBUS_HOME", home)
            .env_remove("NIMBUS_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Waited for when dropped, whatever happens next.
        let mut load = Load(child);
        let stdout = load.0.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        loop {
            let line = lines
                .recv_timeout(LOAD_DEADLINE)
                .expect("the load is in place");
            if line.starts_with("summary:") {
                println!("# {line}");
            }
            if line.starts_with("holding") {
                return load;
            }
        }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// Milliseconds from navigating to `url` until the page shows `rows` rows
/// and says how many there are in all (at least `total`).
fn page_load_ms(tab: &Browser, url: &str, rows: usize, total: usize) -> f64 {
    tab.navigate("about:blank");
    let started = Instant::now();
    tab.navigate(url);
    let script = format!(
        r#"new Promise((resolve) => {{
            const done = () => document.querySelectorAll("main table tbody tr").length === {rows}
                && Number((document.querySelector(".toolbar span")?.textContent || "").split(" of ")[1]) >= {total};
            if (done()) {{ resolve(true); return; }}
            const observer = new MutationObserver(() => {{ if (done()) {{ observer.disconnect(); resolve(true); }} }});
            observer.observe(document, {{ subtree: true, childList: true, characterData: true }});
            setTimeout(() => resolve(false), {});
        }})"#,
        // Before the browser's own deadline, so that this one is reported.
        tab.deadline()
            .saturating_sub(Duration::from_secs(5))
            .as_millis()
    );
    assert_eq!(
        tab.evaluate(&script),
        serde_json::Value::Bool(true),
        "{url} showed its rows"
    );
    started.elapsed().as_secs_f64() * 1000.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let chromium = PathBuf::from(
        std::env::var_os("NIMBUS_CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into()),
    );
    if !chromium.exists() {
        eprintln!(
            "*** no Chromium at {}: the dashboard bench measured NOTHING ***",
            chromium.display()
        );
        return;
    }
    let (actors, objects) = match bench {
        true => (
            env_count("NIMBUS_BENCH_ACTORS", 1000),
            env_count("NIMBUS_BENCH_OBJECTS", 10_000),
        ),
        false => (20, 200),
    };
    let home = tempfile::tempdir().unwrap();
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let started = nimbus(
        home.path(),
        &[
            "start",
            "--head",
            "--port",
            &port,
            "--node-ip-address",
            "127.0.0.1",
            "--dashboard-port",
            "0",
            // The microbench places its callers on the node named "head".
            "--node-name",
            "head",
        ],
    );
    let stop = scopeguard(home.path());
    let head = line(&started, "address:");
    let url = line(&started, "dashboard:");
    nimbus(
        home.path(),
        &[
            "start",
            "--address",
            &head,
            "--node-ip-address",
            "127.0.0.1",
            "--node-name",
            "node-1",
        ],
    );
    let deadline = if bench {
        PAGE_DEADLINE
    } else {
        TEST_PAGE_DEADLINE
    };
    let tab = Browser::launch(&chromium, (1400, 900), deadline);

    if bench {
        // Closed and open alternate, so that drift (caches, the page
        // cache, other load) falls on both alike.
        let pid = head_pid(home.path(), "head");
        let (mut closed, mut open) = (Vec::new(), Vec::new());
        for _ in 0..CPU_ROUNDS {
            closed.push(head_cpu_during_microbench(home.path(), &head, pid));
            tab.navigate(&format!("{url}#/cluster"));
            tab.wait_for_element("#summary");
            open.push(head_cpu_during_microbench(home.path(), &head, pid));
            tab.navigate("about:blank");
        }
        let spread = |v: &[f64]| {
            let (lo, hi) = (
                v.iter().copied().fold(f64::INFINITY, f64::min),
                v.iter().copied().fold(0.0, f64::max),
            );
            format!("{lo:.2}..{hi:.2}")
        };
        println!(
            "# head CPU s, {CPU_ROUNDS} rounds: closed {}, open {}",
            spread(&closed),
            spread(&open)
        );
        let (closed, open) = (median(closed), median(open));
        println!("head_cpu_s_dashboard_closed: {closed:.2} s");
        println!("head_cpu_s_dashboard_open: {open:.2} s");
        println!("head_cpu_open_over_closed: {:.2} x", open / closed);
    }

    let load = Load::start(home.path(), &head, actors, objects);
    let actors_url = format!("{url}#/actors");
    let objects_url = format!("{url}#/objects");
    let times = |url: &str, total: usize| {
        let rows = total.min(100);
        median(
            (0..5)
                .map(|_| page_load_ms(&tab, url, rows, total))
                .collect(),
        )
    };
    let actors_ms = times(&actors_url, actors);
    // The driver's objects, and nothing else in the stores.
    let objects_ms = times(&objects_url, objects);
    println!("dashboard_actors: {actors} actors");
    println!("dashboard_actors_page_load_ms: {actors_ms:.0} ms");
    println!("dashboard_objects: {objects} objects");
    println!("dashboard_objects_page_load_ms: {objects_ms:.0} ms");
    drop(load);
    drop(stop);
}

/// Stops the nodes started under `home` when dropped.
fn scopeguard(home: &Path) -> impl Drop + '_ {
    struct Stop<'a>(&'a Path);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = Command::new(env!("CARGO_BIN_EXE_nimbus"))
                .args(["stop", "--timeout-s", "10"])
                .env("NIMBUS_HOME", self.0)
                .output();
        }
    }
    Stop(home)
}
