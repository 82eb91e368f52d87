//! `/metrics` after a workload, read with an independent Prometheus
//! text-format parser: a head and two members started with the CLI, each
//! with `--metrics-export-port`, the custom-actor example and a task job
//! run against them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prometheus_parse::{Sample, Scrape, Value};
use tempfile::TempDir;

use super::cli::{nimbus, start_cluster, succeeds, StopOnDrop};
use super::dashboard::{example, get, line_value, HeldExample};

/// The longest the pushed metrics may take to show a workload.
const PUSH_DEADLINE: Duration = Duration::from_secs(30);

pub fn scrape(url: &str) -> Vec<Sample> {
    let address = url
        .strip_prefix("http://")
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .unwrap();
    let (status, head, body) = get(address, "/metrics", None);
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("text/plain"), "{head}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("not Prometheus text ({e}):\n{body}"))
        .samples
}

/// The sum of `name`'s samples whose labels include `labels` (a
/// histogram counts its observations).
pub fn total(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            Value::Summary(_) => 0.0,
        })
        .sum()
}

/// Scrapes `url` until `done` holds of the samples (pushes arrive every
/// few seconds), for at most [`PUSH_DEADLINE`].
pub fn scrape_until(url: &str, what: &str, done: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let deadline = Instant::now() + PUSH_DEADLINE;
    loop {
        let samples = scrape(url);
        if done(&samples) {
            return samples;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not in {url} within {PUSH_DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A head and two members started with the CLI under `home`, each serving
/// `/metrics`: the head's address, and the metrics URLs of the head,
/// `node-1` and `node-2`, in that order.
fn metrics_cluster(home: &std::path::Path) -> (String, Vec<String>) {
    let started = start_cluster(
        home,
        &["--no-dashboard", "--metrics-export-port", "0"],
        &["node-1", "node-2"],
        &["--metrics-export-port", "0"],
    );
    let head = line_value(&started[0], "address:");
    let urls = started
        .iter()
        .map(|out| line_value(out, "metrics:"))
        .collect();
    (head, urls)
}

#[test]
fn every_node_serves_its_metrics_and_its_processes() {
    let home = TempDir::new().unwrap();
    let _stop = StopOnDrop(home.path());
    let (head, urls) = metrics_cluster(home.path());
    let urls: HashMap<&str, String> = ["head", "node-1", "node-2"].into_iter().zip(urls).collect();
    let head_url = urls["head"].clone();
    let before = scrape(&head_url);
    assert_eq!(total(&before, "nimbus_members", &[("state", "alive")]), 3.0);

    // Tasks and objects, as a submitted job.
    let tasks = example("tasks");
    succeeds(
        home.path(),
        &[
            "job",
            "submit",
            "--",
            tasks.to_str().unwrap(),
            "--tasks",
            "20",
            "--maps",
            "2",
            "--broadcast-mib",
            "1",
            "--readers",
            "1",
        ],
    );
    // Actor calls, a worker SIGKILLed and restarted; the example holds its
    // actors, so their workers go on pushing.
    let held = HeldExample::start(home.path(), &head);
    // A connection with the wrong token.
    let wrong = format!("nimbus1-{}", "A".repeat(43));
    let refused = nimbus(
        home.path(),
        &["status", "--address", &head, "--token", &wrong],
    );
    assert!(!refused.status.success());

    // The task job's driver pushed its last metrics as it ended; the bank's
    // driver pushes every few seconds.
    let samples = scrape_until(&head_url, "the bank driver's calls", |s| {
        total(s, "nimbus_actor_calls_total", &[("outcome", "ok")]) >= 200.0
    });
    let calls_ok = total(&samples, "nimbus_actor_calls_total", &[("outcome", "ok")]);
    assert!(
        calls_ok >= 200.0,
        "the bank's 200 transfers and more: {calls_ok}"
    );
    assert!(total(&samples, "nimbus_actor_call_seconds", &[]) >= calls_ok);
    // As many tasks as the head recorded, all finished.
    let listed = succeeds(
        home.path(),
        &["list", "tasks", "--json", "--limit", "10000"],
    );
    let listed = serde_json::from_str::<serde_json::Value>(listed.trim()).unwrap();
    // Each names the node it ran on, though its job (and its worker) ended.
    let tasks = listed.as_array().unwrap();
    assert!(
        tasks
            .iter()
            .all(|t| t["node"].as_str().is_some_and(|n| !n.is_empty())),
        "{listed:#}"
    );
    let listed = tasks.len() as f64;
    assert!(
        listed >= 23.0,
        "20 tasks, 2 maps, a reduce and more: {listed}"
    );
    assert_eq!(total(&samples, "nimbus_tasks_submitted_total", &[]), listed);
    assert_eq!(
        total(
            &samples,
            "nimbus_tasks_finished_total",
            &[("outcome", "ok")]
        ),
        listed
    );
    assert_eq!(total(&samples, "nimbus_task_seconds", &[]), listed);
    assert!(total(&samples, "nimbus_objects_put_bytes_total", &[]) >= (1 << 20) as f64);
    assert_eq!(
        total(&samples, "nimbus_members", &[("state", "alive")]),
        3.0
    );
    assert!(total(&samples, "nimbus_heartbeat_delay_seconds", &[]) > 0.0);
    assert!(total(&samples, "nimbus_handshakes_refused_total", &[]) >= 1.0);
    assert!(total(&samples, "nimbus_connections_total", &[("direction", "in")]) >= 3.0);
    assert!(total(&samples, "nimbus_object_store_capacity_bytes", &[]) > 0.0);
    assert!(total(&samples, "nimbus_workers_started_total", &[]) >= 1.0);

    // The members: the workers they started and the one SIGKILLed (on one
    // of them), and the calls the accounts make to each other, which their
    // workers push while they run.
    let member_urls = [urls["node-1"].clone(), urls["node-2"].clone()];
    let scrape_members = || -> Vec<Vec<Sample>> { member_urls.iter().map(|u| scrape(u)).collect() };
    let sum = |members: &[Vec<Sample>], name, labels: &[(&str, &str)]| {
        members.iter().map(|s| total(s, name, labels)).sum::<f64>()
    };
    let deadline = Instant::now() + PUSH_DEADLINE;
    let members = loop {
        let members = scrape_members();
        if sum(&members, "nimbus_actor_calls_total", &[("outcome", "ok")]) > 0.0 {
            break members;
        }
        assert!(
            Instant::now() < deadline,
            "no worker pushed its calls within {PUSH_DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    assert!(
        sum(&members, "nimbus_workers_started_total", &[]) >= 5.0,
        "4 accounts, a counter and a restart"
    );
    assert!(
        sum(
            &members,
            "nimbus_workers_died_total",
            &[("cause", "signal")]
        ) >= 1.0,
        "account-1's SIGKILL"
    );
    for samples in &members {
        assert_eq!(
            total(samples, "nimbus_members", &[]),
            0.0,
            "membership is the head's"
        );
    }
    held.finish();
}

#[test]
fn the_grafana_dashboard_plots_only_metrics_nimbus_records() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let catalog = std::fs::read_to_string(root.join("src/metrics/mod.rs")).unwrap();
    let dashboard = std::fs::read_to_string(root.join("deploy/grafana-nimbus.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut plotted = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                let Some(name) = word.strip_prefix("nimbus_") else {
                    continue;
                };
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(name);
                assert!(
                    catalog.contains(&format!("`nimbus_{family}`")),
                    "the dashboard plots nimbus_{family}, which src/metrics/mod.rs does not list"
                );
                plotted += 1;
            }
        }
    }
    assert!(plotted >= 10, "{plotted}");
}

/// Runs example `name` with `args` against the head at `head` (its token in
/// `home`) to its end; returns its `summary:` line.
fn run_example(home: &std::path::Path, name: &str, args: &[&str], head: &str) -> String {
    let out = std::process::Command::new(example(name))
        .args(args)
        .args(["--address", head])
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_ADDRESS")
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap();
    let printed = super::cli::text(&out);
    assert!(out.status.success(), "{name}: {printed}");
    line_value(&printed, "summary:")
}

/// Runs shorter than one push interval (5 s), whose processes have all
/// exited when the nodes are read: the bank (not held: its job ends, its
/// workers are stopped) and a 2-worker training run of 4 steps. The nodes
/// still serve what those processes did: the accounts' calls, and every
/// training sample, allreduce and checkpoint (before, the members showed
/// none of these: workers were SIGKILLed at the end, before their next
/// push).
#[test]
fn a_short_runs_metrics_outlive_its_processes() {
    let home = TempDir::new().unwrap();
    let _stop = StopOnDrop(home.path());
    let (head, urls) = metrics_cluster(home.path());
    let sum = |name: &str, labels: &[(&str, &str)]| -> f64 {
        urls.iter().map(|u| total(&scrape(u), name, labels)).sum()
    };
    let bank = run_example(home.path(), "custom_actor", &[], &head);
    assert!(bank.contains("total_balance_ok=true"), "{bank}");
    let storage = TempDir::new().unwrap();
    let training = [
        "--workers",
        "2",
        "--epochs",
        "1",
        "--train-samples",
        "512",
        "--storage",
        storage.path().to_str().unwrap(),
    ];
    let trained = run_example(home.path(), "train_mnist", &training, &head);
    assert!(trained.contains("restarts=0"), "{trained}");

    // The workers' last pushes land as they stop; wait for them, with a
    // deadline, on every node together.
    let deadline = Instant::now() + PUSH_DEADLINE;
    let wanted = || {
        sum("nimbus_train_samples_total", &[]) >= 1024.0
            && sum("nimbus_checkpoint_write_seconds", &[]) >= 1.0
    };
    while !wanted() {
        assert!(
            Instant::now() < deadline,
            "the training workers' last metrics did not reach their nodes within {PUSH_DEADLINE:?}: samples {}, checkpoints {}",
            sum("nimbus_train_samples_total", &[]),
            sum("nimbus_checkpoint_write_seconds", &[])
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Every step of the one epoch, once per rank: train_mnist reports a
    // step's samples across the group (2 × 64), and each of the 2 ranks
    // counts its reports: 2 ranks × 4 steps × 128.
    assert_eq!(sum("nimbus_train_samples_total", &[]), 1024.0);
    assert!(sum("nimbus_allreduce_bytes_total", &[]) > 0.0);
    assert!(
        sum("nimbus_allreduce_seconds", &[]) >= 8.0,
        "4 steps × 2 ranks"
    );
    // The members' own: the accounts on them called the bank and each
    // other; only their workers record those calls.
    let member_calls: f64 = urls[1..]
        .iter()
        .map(|u| total(&scrape(u), "nimbus_actor_calls_total", &[("outcome", "ok")]))
        .sum();
    assert!(
        member_calls >= 100.0,
        "the accounts' calls, from workers that have exited: {member_calls}"
    );
}
