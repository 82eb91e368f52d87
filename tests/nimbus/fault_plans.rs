//! The example fault plans (`examples/faults/`), run with `nimbus chaos run`
//! against the examples, as a user would. `make test` builds the examples
//! (`cargo build --workspace --examples`) before running the tests.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::support::within;

fn example(name: &str) -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_nimbus"));
    let path = bin.with_file_name("examples").join(name);
    assert!(
        path.exists(),
        "{} is not built: `cargo build --workspace --examples` first (`make test` does)",
        path.display()
    );
    path
}

fn plan(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/faults")
        .join(name)
        .display()
        .to_string()
}

async fn run(program: &Path, args: &[&str], home: &Path) -> Output {
    tokio::process::Command::new(program)
        .args(args)
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_ADDRESS")
        .env_remove("NIMBUS_TOKEN")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    let out = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// The timeline's fault lines without their `t=` field: what two runs of
/// one seed and plan must share.
fn faults(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("fault "))
        .map(|l| {
            l.split(' ')
                .filter(|w| !w.starts_with("t="))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The packets datagrams the sockets of `class` (`workload`, `nodes`,
/// `workers`) faulted, from the timeline's `packets injected` line (as their
/// sockets reported them): `(processes, dropped + duplicated + reordered +
/// delayed + cut_off)`.
fn packets_injected(out: &str, class: &str) -> (u64, u64) {
    let faulted = ["dropped", "duplicated", "reordered", "delayed", "cut_off"]
        .iter()
        .map(|key| packet_count(out, class, key))
        .sum();
    (packet_count(out, class, "processes"), faulted)
}

/// One count (`processes`, `sent`, `dropped`, ..., `cut_off`) of the
/// timeline's `packets injected target=CLASS` line.
fn packet_count(out: &str, class: &str, key: &str) -> u64 {
    let prefix = format!("packets injected target={class} ");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line: {out}"));
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

fn summary_value<'a>(out: &'a str, key: &str) -> &'a str {
    let summary = out.lines().last().unwrap_or_default();
    assert!(
        summary.starts_with("summary: "),
        "the summary comes last: {out}"
    );
    summary
        .split(' ')
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {summary}"))
}

#[tokio::test]
async fn bank_plan_keeps_the_books_and_replays_the_same_faults() {
    within(Duration::from_secs(120), async {
        let home = tempfile::tempdir().unwrap();
        let bank = example("custom_actor");
        let bank = bank.to_str().unwrap();
        let plan = plan("bank.toml");
        let args = ["chaos", "run", &plan, "--seed", "42", "--", bank];
        let mut runs = Vec::new();
        for _ in 0..2 {
            let out =
                stdout(&run(Path::new(env!("CARGO_BIN_EXE_nimbus")), &args, home.path()).await);
            assert_eq!(summary_value(&out, "total_balance_ok"), "true", "{out}");
            // The plan's packet rules, as planned and as done to the
            // bank's own socket: the partition cut datagrams off (a rule
            // that faulted none would fail the run).
            for planned in [
                "planned packets(partition) target=workload trigger=window=1500ms..2500ms",
                "planned packets(drop=0.05) target=workload trigger=window=0ms..end",
            ] {
                assert!(out.lines().any(|l| l == planned), "{planned:?} in {out}");
            }
            let (processes, faulted) = packets_injected(&out, "workload");
            assert!(processes == 1 && faulted > 0, "{out}");
            assert!(packet_count(&out, "workload", "cut_off") > 0, "{out}");
            runs.push(faults(&out));
        }
        assert_eq!(runs[0], runs[1], "the same faults at the same triggers");
        let kinds = runs[0].join("\n");
        for expected in [
            "kill target=account-2 trigger=message 15 (examples.Transfer)",
            "panic target=account-3 trigger=message 10 (examples.Credit)",
        ] {
            assert!(kinds.contains(expected), "{expected:?} in {kinds}");
        }
    })
    .await;
}

#[tokio::test]
async fn bank_survives_node_loss_stalls_partitions_and_lossy_links() {
    within(Duration::from_secs(150), async {
        let home = tempfile::tempdir().unwrap();
        let bank = example("custom_actor");
        let plan = plan("bank_nodes.toml");
        let args = ["chaos", "run", &plan, "--", bank.to_str().unwrap()];
        let mut runs = Vec::new();
        for _ in 0..2 {
            let out =
                stdout(&run(Path::new(env!("CARGO_BIN_EXE_nimbus")), &args, home.path()).await);
            assert_eq!(summary_value(&out, "total_balance_ok"), "true", "{out}");
            assert_eq!(summary_value(&out, "nodes"), "2", "one node lost: {out}");
            assert_recovered(
                &out,
                &[
                    "links healed",
                    "resumed (SIGCONT)",
                    "declared dead",
                    "actor restarted on",
                ],
            );
            runs.push(faults(&out));
        }
        assert_eq!(runs[0], runs[1], "the same faults at the same triggers");
        assert_eq!(
            runs[0],
            [
                "fault 1 partition(1000ms) target=node-2|head trigger=after=1500ms",
                "fault 2 stop_node(800ms) target=node-2 trigger=after=2600ms",
                "fault 3 degrade_links(drop=0.1,reorder=0.05,delay=0.1,delay_ms=20,6000ms) target=node-2|head trigger=after=3500ms",
                "fault 4 kill_node target=account-1 trigger=message 20 (examples.Transfer)",
            ]
        );
    })
    .await;
}

/// `stall.toml` on 4 nodes: a stall, a node killed and restarted at planned
/// times, every account killed at its 30th transfer.
#[tokio::test]
async fn stall_plan_keeps_the_books() {
    within(Duration::from_secs(120), async {
        let home = tempfile::tempdir().unwrap();
        let bank = example("custom_actor");
        let plan = plan("stall.toml");
        let args = [
            "chaos",
            "run",
            &plan,
            "--nodes",
            "4",
            "--",
            bank.to_str().unwrap(),
        ];
        let out = stdout(&run(Path::new(env!("CARGO_BIN_EXE_nimbus")), &args, home.path()).await);
        assert_eq!(summary_value(&out, "total_balance_ok"), "true", "{out}");
        let faults = faults(&out).join("\n");
        for expected in [
            "stop_node(1000ms) target=node-1 trigger=after=300ms",
            "kill_node target=node-3 trigger=after=1500ms",
            "restart_node target=node-3 trigger=after=6000ms",
        ] {
            assert!(faults.contains(expected), "{expected:?} in {out}");
        }
        assert_recovered(
            &out,
            &[
                "resumed (SIGCONT)",
                "declared dead",
                "rejoined as a new incarnation",
            ],
        );
    })
    .await;
}

#[tokio::test]
async fn mnist_plan_recovers_to_the_fault_free_parameters() {
    mnist_plan(&["--epochs", "1"]).await;
}

/// A node lost at a training step (rank 1's worker kills its node): the
/// group restarts from its checkpoint on the nodes left and ends on the
/// fault-free parameters.
#[tokio::test]
async fn mnist_survives_losing_a_node_at_a_training_step() {
    within(Duration::from_secs(400), async {
        let home = tempfile::tempdir().unwrap();
        let args = ["--epochs", "1", "--checkpoint-every", "10", "--nodes", "3"];
        let plan = plan("mnist_nodes.toml");
        let (clean, out) = mnist_without_and_with(&plan, &[], &args, home.path()).await;
        assert_eq!(
            faults(&out),
            ["fault 1 kill_node target=rank-1 trigger=step 25"],
            "{out}"
        );
        assert_eq!(summary_value(&out, "restarts"), "1", "{out}");
        assert_recovered(&out, &["declared dead", "training restored"]);
        assert_same_parameters(&clean, &out);
    })
    .await;
}

/// The head SIGKILLed at a training step and started again 2 s later
/// (`examples/faults/mnist_head.toml`): training does not notice: no
/// restart of the group, the fault-free parameters.
#[tokio::test]
async fn mnist_rides_out_a_head_restart() {
    within(Duration::from_secs(400), async {
        let home = tempfile::tempdir().unwrap();
        let args = ["--epochs", "1", "--checkpoint-every", "10", "--nodes", "3"];
        let plan = plan("mnist_head.toml");
        let (clean, out) = mnist_without_and_with(&plan, &[], &args, home.path()).await;
        assert_eq!(
            faults(&out),
            [
                "fault 1 kill_node target=head trigger=step 15",
                "fault 2 kill_head(2000ms) target=rank-0 trigger=step 15",
                "fault 3 restart_node target=head trigger=step 15 + 2000ms",
            ],
            "{out}"
        );
        assert_recovered(&out, &["back with its members"]);
        assert_eq!(summary_value(&out, "restarts"), "0", "{out}");
        assert_same_parameters(&clean, &out);
    })
    .await;
}

/// The long variant (`make test-long`): 3 workers, 2 epochs.
#[tokio::test]
#[ignore = "long: run with `make test-long`"]
async fn mnist_plan_with_three_workers_over_two_epochs() {
    mnist_plan(&["--epochs", "2", "--workers", "3", "--nodes", "3"]).await;
}

/// Runs the MNIST example with `extra` arguments without faults, then under
/// `examples/faults/mnist.toml`: the same final parameters.
async fn mnist_plan(extra: &[&str]) {
    within(Duration::from_secs(400), async {
        let home = tempfile::tempdir().unwrap();
        let mut args = vec!["--checkpoint-every", "10"];
        args.extend_from_slice(extra);
        let plan = plan("mnist.toml");
        let (clean, out) =
            mnist_without_and_with(&plan, &["--seed", "7"], &args, home.path()).await;
        assert_eq!(summary_value(&clean, "restarts"), "0", "{clean}");
        assert_eq!(
            faults(&out),
            [
                "fault 1 straggle(200ms x 5 steps) target=rank-1 trigger=step 5",
                "fault 2 fail_checkpoint_write(DiskFull) target=rank-0 trigger=step 20",
                "fault 3 hang_in_collective target=rank-1 trigger=step 25",
                "fault 4 kill target=rank-1 trigger=step 33",
            ],
            "{out}"
        );
        // The disk full and the hang restart from the checkpoint; the kill
        // is healed from the surviving peer.
        assert_eq!(summary_value(&out, "restarts"), "2", "{out}");
        assert!(
            out.lines()
                .any(|l| l.contains("healed from a peer") && l.contains("no step redone")),
            "the kill is healed: {out}"
        );
        let restored = out
            .lines()
            .filter(|l| l.starts_with("recovery run ") && l.contains("training restored"))
            .count();
        assert_eq!(restored, 3, "each recovery is in the timeline: {out}");
        assert_same_parameters(&clean, &out);
    })
    .await;
}

#[tokio::test]
async fn mnist_over_the_network_collective_survives_packet_faults_on_every_socket() {
    within(Duration::from_secs(240), async {
        let home = tempfile::tempdir().unwrap();
        // Loss, duplication and reordering on every node's and every
        // worker's socket: the ring's chunks travel over QUIC, which must
        // carry them through.
        let plan = home.path().join("lossy.toml");
        std::fs::write(
            &plan,
            "seed = 9\n[[packet_faults.rules]]\ndrop = 0.02\n[node_packet_faults]\nworkers = true\n[[node_packet_faults.rules]]\ndrop = 0.03\nduplicate = 0.02\nreorder = 0.02\n",
        )
        .unwrap();
        let args = [
            "--epochs",
            "1",
            "--train-samples",
            "2000",
            "--collective",
            "network",
        ];
        let (clean, out) =
            mnist_without_and_with(plan.to_str().unwrap(), &[], &args, home.path()).await;
        for planned in [
            "planned packets(drop=0.02) target=workload trigger=window=0ms..end",
            "planned packets(drop=0.03,duplicate=0.02,reorder=0.02) target=nodes+workers trigger=window=0ms..end",
        ] {
            assert!(out.lines().any(|l| l == planned), "{planned:?} in {out}");
        }
        assert!(faults(&out).is_empty(), "nothing but packet faults: {out}");
        // What the sockets did, by kind of process: the driver's, the
        // nodes' (3) and the training workers' (2).
        for (class, at_least) in [("workload", 1), ("nodes", 3), ("workers", 2)] {
            let (processes, faulted) = packets_injected(&out, class);
            assert!(processes >= at_least, "{class}: {processes} processes: {out}");
            assert!(faulted > 0, "{class}: no datagram faulted: {out}");
        }
        assert_eq!(summary_value(&out, "restarts"), "0", "{out}");
        assert_same_parameters(&clean, &out);
    })
    .await;
}

/// Runs the MNIST example with `args` (and storage under `home`) without
/// faults, then under `plan` (`nimbus chaos run PLAN CHAOS_ARGS --`):
/// both outputs.
async fn mnist_without_and_with(
    plan: &str,
    chaos_args: &[&str],
    args: &[&str],
    home: &Path,
) -> (String, String) {
    let storage = home.join("runs");
    let mnist = example("train_mnist");
    let mut common = args.to_vec();
    common.extend(["--storage", storage.to_str().unwrap()]);
    let clean = stdout(&run(&mnist, &common, home).await);
    let mut chaos = vec!["chaos", "run", plan];
    chaos.extend_from_slice(chaos_args);
    chaos.extend(["--", mnist.to_str().unwrap()]);
    chaos.extend(common);
    let out = stdout(&run(Path::new(env!("CARGO_BIN_EXE_nimbus")), &chaos, home).await);
    (clean, out)
}

/// The run under faults ended on the fault-free run's parameters.
fn assert_same_parameters(clean: &str, out: &str) {
    assert_eq!(
        summary_value(out, "params_sha256"),
        summary_value(clean, "params_sha256"),
        "the same final parameters as the fault-free run"
    );
}

/// Each of `recoveries` is in a `recovery` line of the timeline.
fn assert_recovered(out: &str, recoveries: &[&str]) {
    for recovery in recoveries {
        assert!(
            out.lines()
                .any(|l| l.starts_with("recovery ") && l.contains(recovery)),
            "{recovery:?} in {out}"
        );
    }
}
