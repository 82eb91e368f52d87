//! The training tests; see `main.rs`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nimbus::placement::PlacementStrategy;
use nimbus_train::checkpoint::fence::FENCE_FILE;
use nimbus_train::{
    Checkpoint, CollectiveBackend, RunConfig, ScalingConfig, TrainError, TrainEvent, TrainResult,
    Trainer,
};

use crate::mnist::{DataSource, FailMode, MnistConfig, MnistLoop};
use crate::serving::{
    a_trained_checkpoint_is_served_over_http_in_batches,
    serving_gives_replicas_back_to_a_training_run,
};
use crate::tune::{
    a_failed_trainer_trial_resumes_from_its_checkpoint,
    a_trainer_trial_past_its_timeout_frees_its_run, tune_trials_are_whole_training_runs_and_stop,
};
use crate::unused::{
    a_parameter_one_rank_does_not_use_keeps_replicas_identical,
    bf16_parameters_are_averaged_and_replicas_stay_identical,
};
use crate::{boxed, Test};

pub const ALL: &[(&str, Test)] = &[
    ("two_workers_stay_identical_and_loss_falls", |d| {
        boxed(two_workers_stay_identical_and_loss_falls(d))
    }),
    (
        "a_parameter_one_rank_does_not_use_keeps_replicas_identical",
        |d| {
            boxed(a_parameter_one_rank_does_not_use_keeps_replicas_identical(
                d,
            ))
        },
    ),
    (
        "bf16_parameters_are_averaged_and_replicas_stay_identical",
        |d| boxed(bf16_parameters_are_averaged_and_replicas_stay_identical(d)),
    ),
    ("a_trained_checkpoint_is_served_over_http_in_batches", |d| {
        boxed(a_trained_checkpoint_is_served_over_http_in_batches(d))
    }),
    ("serving_gives_replicas_back_to_a_training_run", |d| {
        boxed(serving_gives_replicas_back_to_a_training_run(d))
    }),
    ("kill_and_panic_restart_from_checkpoint_bit_exact", |d| {
        boxed(kill_and_panic_restart_from_checkpoint_bit_exact(d))
    }),
    (
        "a_killed_worker_heals_from_a_peer_with_no_step_redone",
        |d| boxed(a_killed_worker_heals_from_a_peer_with_no_step_redone(d)),
    ),
    (
        "training_on_parquet_shards_heals_and_restarts_bit_exact",
        |d| boxed(training_on_parquet_shards_heals_and_restarts_bit_exact(d)),
    ),
    ("training_faults_by_step_recover_bit_exact", |d| {
        boxed(training_faults_by_step_recover_bit_exact(d))
    }),
    ("corrupt_latest_checkpoint_falls_back_to_previous", |d| {
        boxed(corrupt_latest_checkpoint_falls_back_to_previous(d))
    }),
    ("max_failures_exhausted_returns_the_root_cause", |d| {
        boxed(max_failures_exhausted_returns_the_root_cause(d))
    }),
    (
        "a_full_disk_stops_the_run_and_keeps_its_last_checkpoint",
        |d| boxed(a_full_disk_stops_the_run_and_keeps_its_last_checkpoint(d)),
    ),
    ("local_mode_and_resume_of_a_finished_run", |d| {
        boxed(local_mode_and_resume_of_a_finished_run(d))
    }),
    ("more_gpus_than_exist_fails_fast", |d| {
        boxed(more_gpus_than_exist_fails_fast(d))
    }),
    ("three_workers_over_the_network_collective", |d| {
        boxed(three_workers_over_the_network_collective(d))
    }),
    ("nccl_without_nccl_fails_clearly", |d| {
        boxed(nccl_without_nccl_fails_clearly(d))
    }),
    ("parameter_aggregator_in_a_worker_process", |d| {
        boxed(parameter_aggregator_in_a_worker_process(d))
    }),
    (
        "elastic_run_continues_with_fewer_workers_after_node_loss",
        |d| boxed(elastic_run_continues_with_fewer_workers_after_node_loss(d)),
    ),
    (
        "storage_not_shared_with_rank_0s_host_fails_at_the_first_checkpoint",
        |d| boxed(storage_not_shared_with_rank_0s_host_fails_at_the_first_checkpoint(d)),
    ),
    ("tune_trials_are_whole_training_runs_and_stop", |d| {
        boxed(tune_trials_are_whole_training_runs_and_stop(d))
    }),
    ("a_failed_trainer_trial_resumes_from_its_checkpoint", |d| {
        boxed(a_failed_trainer_trial_resumes_from_its_checkpoint(d))
    }),
    ("a_trainer_trial_past_its_timeout_frees_its_run", |d| {
        boxed(a_trainer_trial_past_its_timeout_frees_its_run(d))
    }),
];

/// A short run: 1,280 generated training images, batch 32, 2 workers →
/// 20 steps per epoch; a checkpoint every 5 steps.
pub fn small(max_steps: u64) -> MnistConfig {
    MnistConfig {
        epochs: 1,
        batch_size: 32,
        lr: 0.05,
        seed: 7,
        data: DataSource::Embedded {
            train: 1_280,
            test: 200,
        },
        checkpoint_every: Some(5),
        max_steps: Some(max_steps),
        ..MnistConfig::default()
    }
}

/// Where this test process's runs store checkpoints.
pub fn storage() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nimbus-train-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("storage dir");
    dir
}

pub fn run_config(name: &str) -> RunConfig {
    RunConfig::new(name, storage())
        .collective_timeout(Duration::from_secs(20))
        .placement_timeout(Duration::from_secs(20))
}

/// Runs `config` and records the events.
pub async fn fit(
    config: MnistConfig,
    scaling: ScalingConfig,
    run: RunConfig,
) -> (TrainResult, Vec<TrainEvent>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let result = Trainer::<MnistLoop>::new(config, scaling, run)
        .on_event(move |e| seen.lock().unwrap().push(e.clone()))
        .fit()
        .await;
    let events = events.lock().unwrap().clone();
    (result, events)
}

fn losses(result: &TrainResult) -> Vec<f64> {
    result.metrics_history.iter().map(|m| m["loss"]).collect()
}

fn final_sha(result: &TrainResult) -> String {
    result
        .final_parameters_sha256()
        .expect("the final checkpoint loads")
        .expect("a final checkpoint")
}

pub fn ok(result: &TrainResult) {
    if let Some(error) = &result.error {
        panic!("training failed: {error}");
    }
}

async fn two_workers_stay_identical_and_loss_falls(_: &mut nimbus::Driver) {
    let config = MnistConfig {
        check_replicas: true,
        max_steps: Some(20),
        ..small(20)
    };
    let (result, _) = fit(config, ScalingConfig::workers(2), run_config("identical")).await;
    ok(&result);
    assert_eq!(result.workers, 2);
    let losses = losses(&result);
    assert_eq!(losses.len(), 20, "one report per step");
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[15..].iter().sum::<f64>() / 5.0;
    assert!(
        last < first * 0.8,
        "loss falls: first 5 steps {first:.4}, last 5 {last:.4}"
    );
    // Checkpoints at 5, 10, 15 and 20, the last also the epoch's end.
    assert_eq!(result.checkpoint.as_ref().unwrap().index, 20);
}

async fn three_workers_over_the_network_collective(_: &mut nimbus::Driver) {
    // The cross-host backend, forced on one host: ring allreduce through
    // actor messages over QUIC, one worker per node.
    let config = MnistConfig {
        check_replicas: true,
        ..small(12)
    };
    // STRICT_SPREAD: SPREAD is best effort, and put two of the three on
    // one node when this test first looked.
    let scaling = ScalingConfig::workers(3)
        .placement(PlacementStrategy::StrictSpread)
        .collective(CollectiveBackend::Network);
    let (result, events) = fit(config, scaling, run_config("network")).await;
    ok(&result);
    assert_eq!(result.workers, 3);
    // The network collective it asked for, one worker on each node.
    let (backend, mut nodes) = events
        .iter()
        .find_map(|e| match e {
            TrainEvent::Started { backend, nodes, .. } => Some((*backend, nodes.clone())),
            _ => None,
        })
        .expect("the attempt started");
    assert_eq!(backend, Some(CollectiveBackend::Network));
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 3, "one worker per node: {nodes:?}");
    let losses = losses(&result);
    assert_eq!(losses.len(), 12);
    assert!(
        losses[9..].iter().sum::<f64>() < losses[..3].iter().sum::<f64>(),
        "loss falls: {losses:?}"
    );
}

async fn kill_and_panic_restart_from_checkpoint_bit_exact(_: &mut nimbus::Driver) {
    let restarts = metric("nimbus_train_restarts_total");
    let recoveries = metric("nimbus_train_recovery_seconds");
    let (baseline, _) = fit(small(20), ScalingConfig::workers(2), run_config("baseline")).await;
    ok(&baseline);
    assert_eq!(baseline.restarts, 0);
    let expected = final_sha(&baseline);
    for mode in [FailMode::Kill, FailMode::Panic] {
        let config = MnistConfig {
            fail_at_step: Some(12),
            fail_mode: mode,
            ..small(20)
        };
        // The checkpoint restart (a heal would mend this death).
        let run = run_config(&format!("{mode:?}"))
            .max_failures(1)
            .peer_heal(false);
        let (result, events) = fit(config, ScalingConfig::workers(2), run).await;
        ok(&result);
        assert_eq!(result.restarts, 1, "{mode:?}: one restart");
        let failure = events
            .iter()
            .find_map(|e| match e {
                TrainEvent::Failed { reason, .. } => Some(reason.clone()),
                _ => None,
            })
            .expect("the failure is reported");
        let cause = match mode {
            FailMode::Panic => "injected failure at step 12",
            _ => "signal 9",
        };
        assert!(
            failure.contains(cause),
            "{mode:?}: failure names its cause: {failure}"
        );
        let resumed = events.iter().find_map(|e| match e {
            TrainEvent::Started {
                attempt: 1,
                resumed_from,
                ..
            } => Some(resumed_from.clone()),
            _ => None,
        });
        let resumed = resumed
            .flatten()
            .expect("the restart resumes from a checkpoint");
        assert!(
            resumed.ends_with("checkpoint_000000010"),
            "{mode:?}: latest checkpoint before step 12: {}",
            resumed.display()
        );
        assert_eq!(
            losses(&result),
            losses(&baseline),
            "{mode:?}: the same per-step losses"
        );
        assert_eq!(
            final_sha(&result),
            expected,
            "{mode:?}: the same final parameters"
        );
        // On disk: every report as it arrived, the restarted attempt's
        // marked and starting again after the checkpoint it resumed from;
        // the last loss per report is the run's history. Plotted at the end.
        let reports = nimbus_train::results::read_reports(&result.path).unwrap();
        let curve = &nimbus_train::results::loss_curves(&reports)["loss"];
        let curve: Vec<f64> = curve.iter().map(|(_, loss)| *loss).collect();
        assert_eq!(curve, losses(&result), "{mode:?}: metrics.jsonl");
        let resumed: Vec<u64> = reports
            .iter()
            .filter(|r| r.attempt == 1)
            .map(|r| r.index)
            .collect();
        assert_eq!(
            resumed,
            (11..=20).collect::<Vec<_>>(),
            "{mode:?}: {reports:?}"
        );
        assert!(
            reports.iter().filter(|r| r.attempt == 0).count() >= 10,
            "{mode:?}: the first attempt's reports stay: {reports:?}"
        );
        let csv = std::fs::read_to_string(result.path.join("progress.csv")).unwrap();
        assert_eq!(csv.lines().count(), 1 + reports.len(), "{mode:?}: {csv}");
        assert!(result.path.join("loss.svg").is_file(), "{mode:?}: the plot");
    }
    // The supervisor runs in this process: the two restarts and their
    // recoveries are in its metrics.
    assert_eq!(metric("nimbus_train_restarts_total") - restarts, 2.0);
    assert_eq!(metric("nimbus_train_recovery_seconds") - recoveries, 2.0);
}

/// Kills workers of a 3-worker run at a random step (one; two at once;
/// rank 0, the writer of checkpoints) and checks that the group heals from
/// a live peer: no restart, as many steps (reports) as the fault-free
/// run, its final parameters bit for bit, and every rank's whole state
/// (parameters, momentum, position) equal to rank 0's after every step,
/// the first after the heal included (`check_replicas`).
async fn a_killed_worker_heals_from_a_peer_with_no_step_redone(_: &mut nimbus::Driver) {
    use nimbus_train::faults::{TrainingFault, TrainingFaultAction as Action};
    let config = MnistConfig {
        check_replicas: true,
        ..small(14)
    };
    let (baseline, events) = fit(
        config.clone(),
        ScalingConfig::workers(3),
        run_config("heal-baseline"),
    )
    .await;
    ok(&baseline);
    let steps = |events: &[TrainEvent]| {
        events
            .iter()
            .filter(|e| matches!(e, TrainEvent::Reported { .. }))
            .count()
    };
    // 1,280 images over 3 ranks in batches of 32: one epoch of 14 steps,
    // its last checkpoint at the end.
    assert_eq!(steps(&events), 14);
    let expected = final_sha(&baseline);
    let at_step = 2 + rand::random::<u64>() % 12;
    for (name, ranks) in [
        ("one", vec![2]),
        ("two_at_once", vec![1, 2]),
        ("rank_0", vec![0]),
    ] {
        let mut run = run_config(&format!("heal-{name}")).max_failures(2);
        for &rank in &ranks {
            let kill = TrainingFault {
                rank,
                at_step,
                action: Action::Kill,
            };
            run = run.inject(kill);
        }
        let (result, events) = fit(config.clone(), ScalingConfig::workers(3), run).await;
        ok(&result);
        assert_eq!(result.restarts, 0, "{name}: healed, not restarted");
        assert_eq!(steps(&events), 14, "{name}: no step redone");
        assert_eq!(
            final_sha(&result),
            expected,
            "{name}: the fault-free parameters"
        );
        let healed: Vec<(Vec<usize>, Duration)> = events
            .iter()
            .filter_map(|e| match e {
                TrainEvent::Healed { ranks, took } => Some((ranks.clone(), *took)),
                _ => None,
            })
            .collect();
        let Some((replaced, took)) = healed.last() else {
            panic!("{name}: no heal in {events:?}");
        };
        assert_eq!(replaced, &ranks, "{name}: the killed ranks replaced");
        println!("  {name}: killed at step {at_step}, healed in {took:.2?}");
    }
}

/// The MNIST loop on parquet files read through nimbus Data: each worker
/// streams its shard of every epoch; a worker killed mid-epoch is healed
/// from its peer, or the group restarts from a checkpoint, and either way
/// the run ends on the fault-free parameters (the shard of an epoch is
/// the same when read again, from the batch the checkpoint names).
async fn training_on_parquet_shards_heals_and_restarts_bit_exact(_: &mut nimbus::Driver) {
    use nimbus_train::faults::{TrainingFault, TrainingFaultAction as Action};
    let files = tempfile::TempDir::new().unwrap();
    // 1,280 training images in 8 row groups: 4 blocks, 640 images, 20
    // batches of 32 per worker and epoch.
    crate::mnist::data::parquet::write_digits(files.path(), (1_280, 200), 7, 160).unwrap();
    let config = MnistConfig {
        epochs: 2,
        data: DataSource::Parquet(files.path().to_path_buf()),
        check_replicas: true,
        ..small(u64::MAX)
    };
    let steps = |events: &[TrainEvent]| {
        events
            .iter()
            .filter(|e| matches!(e, TrainEvent::Reported { .. }))
            .count()
    };
    let (baseline, events) = fit(
        config.clone(),
        ScalingConfig::workers(2),
        run_config("parquet-baseline"),
    )
    .await;
    ok(&baseline);
    assert_eq!(steps(&events), 40, "2 epochs of 20 steps");
    let expected = final_sha(&baseline);
    // Killed at step 27: the 8th batch of the second epoch.
    let kill = TrainingFault {
        rank: 1,
        at_step: 27,
        action: Action::Kill,
    };
    for (name, heal) in [("healed", true), ("restarted", false)] {
        let run = run_config(&format!("parquet-{name}"))
            .max_failures(1)
            .peer_heal(heal)
            .inject(kill.clone());
        let (result, events) = fit(config.clone(), ScalingConfig::workers(2), run).await;
        ok(&result);
        assert_eq!(result.restarts, u32::from(!heal), "{name}");
        if heal {
            assert_eq!(steps(&events), 40, "{name}: no step redone");
        }
        assert_eq!(
            final_sha(&result),
            expected,
            "{name}: the fault-free parameters"
        );
    }
}

async fn training_faults_by_step_recover_bit_exact(_: &mut nimbus::Driver) {
    use nimbus_train::faults::{StorageError, TrainingFault, TrainingFaultAction as Action};
    let (baseline, _) = fit(
        small(20),
        ScalingConfig::workers(2),
        run_config("baseline-3"),
    )
    .await;
    ok(&baseline);
    let expected = final_sha(&baseline);
    let fault = |rank, at_step, action| TrainingFault {
        rank,
        at_step,
        action,
    };
    // (name, faults, restarts expected, the checkpoint the restart resumes from)
    let cases = [
        (
            "straggler",
            vec![fault(
                1,
                4,
                Action::Straggle {
                    delay_ms: 100,
                    steps: 3,
                },
            )],
            0,
            None,
        ),
        (
            "hang_in_collective",
            vec![fault(1, 8, Action::HangInCollective)],
            1,
            Some(5),
        ),
        (
            "disk_full",
            vec![fault(
                0,
                10,
                Action::FailCheckpointWrite {
                    error: StorageError::DiskFull,
                },
            )],
            1,
            Some(5),
        ),
        (
            "permission_denied",
            vec![fault(
                0,
                10,
                Action::FailCheckpointWrite {
                    error: StorageError::PermissionDenied,
                },
            )],
            1,
            Some(5),
        ),
        (
            "torn_write",
            vec![fault(0, 10, Action::TornCheckpointWrite)],
            1,
            Some(5),
        ),
        (
            "corrupt_then_kill",
            vec![
                fault(0, 10, Action::CorruptCheckpoint),
                fault(1, 13, Action::Kill),
            ],
            1,
            Some(5),
        ),
    ];
    for (name, faults, restarts, resumed_at) in cases {
        let mut run = run_config(&format!("fault-{name}"))
            .max_failures(1)
            .peer_heal(false)
            .collective_timeout(Duration::from_secs(2));
        for f in &faults {
            run = run.inject(f.clone());
        }
        let run_dir = run.run_dir();
        let started = Instant::now();
        let (result, events) = fit(small(20), ScalingConfig::workers(2), run).await;
        ok(&result);
        assert_eq!(result.restarts, restarts, "{name}: restarts");
        let injected: Vec<String> = events
            .iter()
            .filter_map(|e| match e {
                TrainEvent::FaultInjected {
                    fault,
                    target,
                    trigger,
                } => Some(format!("{fault} {target} {trigger}")),
                _ => None,
            })
            .collect();
        let announced = faults.len();
        assert_eq!(
            injected.len(),
            announced,
            "{name}: every fault is reported: {injected:?}"
        );
        // Each restart was caused by the fault, not by something else that
        // happens to restart the group (a timeout, a crash).
        let failures: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                TrainEvent::Failed { reason, .. } => Some(reason.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(failures.len() as u32, restarts, "{name}: {failures:?}");
        let cause = match name {
            "disk_full" => "os error 28",
            "permission_denied" => "os error 13",
            "hang_in_collective" => "collective timed out",
            _ => "chaos: ",
        };
        for failure in &failures {
            assert!(
                failure.contains(cause),
                "{name}: failed of {failure:?}, not {cause:?}"
            );
        }
        let resumed = events.iter().find_map(|e| match e {
            TrainEvent::Started {
                attempt: 1,
                resumed_from,
                ..
            } => resumed_from.clone(),
            _ => None,
        });
        let resumed_index = resumed.map(|p| {
            Checkpoint::load(&p)
                .expect("the resumed checkpoint loads")
                .index()
        });
        assert_eq!(resumed_index, resumed_at, "{name}: resumed from");
        assert_eq!(
            final_sha(&result),
            expected,
            "{name}: the fault-free run's parameters"
        );
        let leftovers: Vec<_> = std::fs::read_dir(&run_dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(
            leftovers.is_empty(),
            "{name}: no torn temporary left: {leftovers:?}"
        );
        println!(
            "  {name}: recovered in {:.1?} overall: {injected:?}",
            started.elapsed()
        );
    }
}

async fn corrupt_latest_checkpoint_falls_back_to_previous(_: &mut nimbus::Driver) {
    let (baseline, _) = fit(
        small(20),
        ScalingConfig::workers(2),
        run_config("baseline-2"),
    )
    .await;
    ok(&baseline);
    let config = MnistConfig {
        fail_at_step: Some(14),
        fail_mode: FailMode::CorruptLatestThenKill,
        ..small(20)
    };
    let run = run_config("corrupt").max_failures(1).peer_heal(false);
    let run_dir = run.run_dir();
    let (result, events) = fit(config, ScalingConfig::workers(2), run).await;
    ok(&result);
    let corrupted = PathBuf::from(
        std::fs::read_to_string(run_dir.join("corrupted")).expect("a checkpoint was corrupted"),
    );
    assert_eq!(result.restarts, 1, "one restart, from the older checkpoint");
    // The checkpoints saved before the failure: the corrupted one is the
    // latest, the restart must resume from the one before it.
    let saved: Vec<u64> = events
        .iter()
        .take_while(|e| !matches!(e, TrainEvent::Failed { .. }))
        .filter_map(|e| match e {
            TrainEvent::CheckpointSaved(saved) => Some(saved.index),
            _ => None,
        })
        .collect();
    let corrupted_index = events.iter().find_map(|e| match e {
        TrainEvent::CheckpointSaved(saved) if saved.path.file_name() == corrupted.file_name() => {
            Some(saved.index)
        }
        _ => None,
    });
    assert_eq!(
        corrupted_index,
        saved.last().copied(),
        "the latest was corrupted"
    );
    let previous = saved.iter().rev().nth(1).copied();
    assert!(
        previous.is_some(),
        "a checkpoint before the corrupted one: {saved:?}"
    );
    let resumed = events.iter().find_map(|e| match e {
        TrainEvent::Started {
            attempt: 1,
            resumed_from,
            ..
        } => resumed_from.clone(),
        _ => None,
    });
    let resumed_index = resumed.map(|p| {
        Checkpoint::load(&p)
            .expect("the resumed checkpoint loads")
            .index()
    });
    assert_eq!(
        resumed_index, previous,
        "resumed from the checkpoint before the corrupted one"
    );
    assert_eq!(
        final_sha(&result),
        final_sha(&baseline),
        "still bit-exact from the older checkpoint"
    );
}

async fn max_failures_exhausted_returns_the_root_cause(_: &mut nimbus::Driver) {
    let config = MnistConfig {
        fail_at_step: Some(3),
        ..small(20)
    };
    let started = Instant::now();
    let (result, _) = fit(config, ScalingConfig::workers(2), run_config("exhausted")).await;
    let error = result
        .error
        .expect("max_failures 0 and one failure: the run fails");
    match &error {
        TrainError::FailuresExhausted {
            failures: 1,
            max_failures: 0,
            first,
            ..
        } => {
            assert!(first.contains("signal 9"), "root cause first: {first}");
        }
        other => panic!("unexpected error: {other}"),
    }
    println!("  failed after {:.1?}: {error}", started.elapsed());
}

/// A tmpfs of `bytes` mounted at `dir` while it lives (needs root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Tmpfs {
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={bytes},mode=0700"))
            .arg("tmpfs")
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mount a tmpfs at {}: {status}",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Bytes of the files in `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// A real full disk: a run on a tmpfs with room for one checkpoint (of
/// steps 5, 10, 15) stops at the second with the space it needs and the
/// space free, without a restart, keeps the first, and leaves no partial
/// write. Before, each restart hit the same full disk until
/// `max_failures` was spent.
async fn a_full_disk_stops_the_run_and_keeps_its_last_checkpoint(_: &mut nimbus::Driver) {
    // SAFETY: a plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        println!("  SKIPPED: mounting a small tmpfs needs root");
        return;
    }
    // One checkpoint's size, from a run on the usual storage.
    let (sized, _) = fit(small(5), ScalingConfig::workers(2), run_config("sized")).await;
    ok(&sized);
    let one = dir_bytes(&sized.checkpoint.expect("a checkpoint").path);
    let dir = tempfile::TempDir::new().unwrap();
    let _disk = Tmpfs::mount(dir.path(), one * 3 / 2);
    let run = RunConfig::new("full", dir.path())
        .max_failures(3)
        .collective_timeout(Duration::from_secs(20))
        .placement_timeout(Duration::from_secs(20));
    let run_dir = run.run_dir();
    let (result, events) = fit(small(20), ScalingConfig::workers(2), run).await;
    match &result.error {
        Some(TrainError::StorageFull(full)) => {
            assert_eq!(full.index, 10, "{full}");
            assert!(full.needed > full.free, "{full}");
            assert_eq!(full.dir, run_dir, "{full}");
            let text = TrainError::StorageFull(full.clone()).to_string();
            assert!(text.contains("storage_path"), "names the setting: {text}");
        }
        other => panic!("expected StorageFull, got {other:?}"),
    }
    assert_eq!(result.restarts, 0, "no restart onto the same full disk");
    let failed = events
        .iter()
        .filter(|e| matches!(e, TrainEvent::Failed { .. }))
        .count();
    assert_eq!(failed, 1, "{events:?}");
    let kept = result.checkpoint.expect("the last good checkpoint");
    assert_eq!(Checkpoint::load(&kept.path).expect("it loads").index(), 5);
    let mut entries: Vec<String> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        [
            FENCE_FILE,
            "checkpoint_000000005",
            "loss.svg",
            "metrics.jsonl",
            "progress.csv"
        ],
        "no partial write (the run's results files beside the checkpoint)"
    );
}

/// Rank 0 on a node that sees the run's storage as a disk of its own (a
/// mount namespace with a tmpfs over it): as on two hosts without shared
/// storage, the driver does not find the first checkpoint, and the run
/// stops there, naming the node and the fix. Before, it trained on and
/// every restart started from scratch, silently.
async fn storage_not_shared_with_rank_0s_host_fails_at_the_first_checkpoint(
    driver: &mut nimbus::Driver,
) {
    // SAFETY: a plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        println!("  SKIPPED: a node with a mount namespace of its own needs root");
        return;
    }
    let storage = tempfile::TempDir::new().unwrap();
    let cluster = driver.local_cluster().expect("a local cluster");
    let resources = r#"{"elsewhere": 1}"#;
    let index = cluster
        .add_node_with_private_dirs(&["--resources", resources], &[(storage.path(), 256 << 20)])
        .unwrap();
    let node = cluster.node(index).unwrap().name().to_string();
    let mut scaling = ScalingConfig::workers(1);
    scaling.resources_per_worker.set("elsewhere", 1.0);
    let run = RunConfig::new("unshared", storage.path())
        .max_failures(3)
        .placement_timeout(Duration::from_secs(20));
    let (result, events) = fit(small(20), scaling, run).await;
    match &result.error {
        Some(TrainError::StorageNotShared(unshared)) => {
            assert_eq!(unshared.node, node, "{unshared}");
            assert!(
                unshared.path.ends_with("checkpoint_000000005"),
                "{unshared}"
            );
            let text = unshared.to_string();
            assert!(text.contains("storage_path"), "names the setting: {text}");
        }
        other => panic!("expected StorageNotShared, got {other:?}"),
    }
    assert_eq!(result.restarts, 0, "{events:?}");
    cluster.kill(index).unwrap();
}

/// This process's metric `name` (a counter's value, a histogram's count),
/// read back with a Prometheus text parser.
fn metric(name: &str) -> f64 {
    let text = nimbus::metrics::render();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(b) => b.last().map_or(0.0, |b| b.count),
            _ => 0.0,
        })
        .sum()
}

async fn local_mode_and_resume_of_a_finished_run(_: &mut nimbus::Driver) {
    let (steps, writes) = (
        metric("nimbus_train_step_seconds"),
        metric("nimbus_checkpoint_write_seconds"),
    );
    let (local, _) = fit(small(10), ScalingConfig::workers(0), run_config("local")).await;
    ok(&local);
    // The loop ran in this process: its metrics are here.
    assert_eq!(
        metric("nimbus_train_step_seconds") - steps,
        9.0,
        "between 10 reports"
    );
    assert_eq!(
        metric("nimbus_checkpoint_write_seconds") - writes,
        2.0,
        "steps 5 and 10"
    );
    assert_eq!(local.workers, 0);
    assert_eq!(losses(&local).len(), 10);
    let finished = local.checkpoint.clone().expect("a checkpoint");
    assert_eq!(finished.index, 10);
    // Resume the finished run on 2 workers for 5 more steps.
    let config = MnistConfig {
        max_steps: Some(15),
        ..small(15)
    };
    let result =
        Trainer::<MnistLoop>::new(config, ScalingConfig::workers(2), run_config("resumed"))
            .resume_from_checkpoint(&finished.path)
            .fit()
            .await;
    ok(&result);
    let steps: Vec<u64> = result
        .metrics_history
        .iter()
        .map(|m| m["step"] as u64)
        .collect();
    assert_eq!(
        steps,
        (11..=15).collect::<Vec<_>>(),
        "continues after the checkpoint's step"
    );
    // A checkpoint path that is not one is refused with a clear error.
    let bogus = Trainer::<MnistLoop>::new(small(5), ScalingConfig::workers(1), run_config("bogus"))
        .resume_from_checkpoint(Path::new("/nonexistent/checkpoint"))
        .fit()
        .await;
    let error = bogus.error.expect("a bad resume path fails").to_string();
    assert!(
        error.contains("cannot resume") && error.contains("/nonexistent/checkpoint"),
        "{error}"
    );
}

/// GPUs the test cluster offers in all.
async fn cluster_gpus(driver: &mut nimbus::Driver) -> f64 {
    let cluster = driver.local_cluster().expect("a local cluster");
    let status = cluster.client().await.unwrap().status().await.unwrap();
    status
        .alive()
        .map(|n| n.resources.total.amount(nimbus::cluster::GPU))
        .sum()
}

async fn nccl_without_nccl_fails_clearly(driver: &mut nimbus::Driver) {
    // Where the binary has the `cuda` feature and the machine GPUs, NCCL
    // may well load: this test is about machines without it.
    if cfg!(feature = "cuda") && cluster_gpus(driver).await > 0.0 {
        println!("  SKIPPED: this build and machine may have NCCL (scripts/gpu-check.sh is the GPU check)");
        return;
    }
    let started = Instant::now();
    let scaling = ScalingConfig::workers(2).collective(CollectiveBackend::Nccl);
    let (result, _) = fit(small(5), scaling, run_config("nccl")).await;
    let error = result.error.expect("no NCCL here").to_string();
    assert!(error.contains("cannot form an NCCL group"), "{error}");
    assert!(
        error.contains("without the `cuda` feature")
            || error.contains("libcuda")
            || error.contains("NCCL not found"),
        "names what is missing: {error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

async fn more_gpus_than_exist_fails_fast(driver: &mut nimbus::Driver) {
    // One GPU worker more than the cluster has GPUs, whatever the machine.
    let workers = cluster_gpus(driver).await as usize + 1;
    let started = Instant::now();
    let scaling = ScalingConfig::workers(workers).use_gpu(true);
    let (result, _) = fit(small(5), scaling, run_config("gpus")).await;
    let error = result
        .error
        .expect("more GPU workers than GPUs fails")
        .to_string();
    assert!(error.contains("GPU"), "names the resource: {error}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "fails fast: {:?}",
        started.elapsed()
    );
}

async fn elastic_run_continues_with_fewer_workers_after_node_loss(driver: &mut nimbus::Driver) {
    // 3 workers, one per node: node 2 is killed after the first reports,
    // the run goes on with 2; node 2 is started again, the run grows back
    // to 3 (from its latest checkpoint) and finishes with 3.
    let config = MnistConfig {
        epochs: 30,
        ..small(300)
    };
    let scaling = ScalingConfig::elastic(2, 3).placement(PlacementStrategy::StrictSpread);
    let run = run_config("elastic").max_failures(3);
    let (tell, mut told) = tokio::sync::mpsc::unbounded_channel();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let (mut killed, mut restarted) = (false, false);
    let trainer = Trainer::<MnistLoop>::new(config, scaling, run).on_event(move |e| {
        record.lock().unwrap().push(e.clone());
        match e {
            // Once each: a restart from the start reports step 3 again.
            TrainEvent::Reported { index: 3, .. } if !killed => {
                killed = true;
                let _ = tell.send("kill");
            }
            TrainEvent::Started { workers: 2, .. } if !restarted => {
                restarted = true;
                let _ = tell.send("restart");
            }
            _ => {}
        }
    });
    let training = trainer.fit();
    tokio::pin!(training);
    let result = loop {
        tokio::select! {
            result = &mut training => break result,
            Some(what) = told.recv() => {
                let cluster = driver.local_cluster().expect("a local cluster");
                match what {
                    "kill" => cluster.kill(2).expect("node 2 is killed"),
                    _ => cluster.restart(2).expect("node 2 comes back"),
                }
            }
        }
    };
    ok(&result);
    let events = seen.lock().unwrap().clone();
    let sizes: Vec<usize> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Started { workers, .. } => Some(*workers),
            _ => None,
        })
        .collect();
    assert_eq!(sizes.first(), Some(&3), "started with 3: {sizes:?}");
    assert!(
        sizes.contains(&2),
        "went on with 2 after the node loss: {sizes:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, TrainEvent::Rescaling { from: 2, to: 3 })),
        "grew back: {sizes:?}"
    );
    let failures: Vec<&String> = events
        .iter()
        .filter_map(|e| match e {
            TrainEvent::Failed { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        result.workers, 3,
        "finished with 3: {sizes:?}, failures {failures:?}"
    );
}

async fn parameter_aggregator_in_a_worker_process(_: &mut nimbus::Driver) {
    use nimbus::actor::{spawn, SpawnOptions};
    use nimbus_train::{
        Aggregation, AggregatorArgs, ParameterAggregator, Params, Pull, PushAverage, PushGradient,
    };
    let sync = AggregatorArgs {
        initial: Params::from_f32(&[0.0; 3]),
        mode: Aggregation::Synchronous { workers: 2 },
    };
    let server = spawn::<ParameterAggregator>(sync, SpawnOptions::default().num_cpus(0.1))
        .await
        .expect("the aggregator starts");
    // Two pushers (two handles, as two workers would have) meet in round 0.
    let other = server.clone();
    let a = server.send(PushAverage {
        round: 0,
        params: Params::from_f32(&[1.0, 2.0, 3.0]),
    });
    let b = other.send(PushAverage {
        round: 0,
        params: Params::from_f32(&[3.0, 4.0, 5.0]),
    });
    let (a, b) = futures::join!(a, b);
    assert_eq!(a.unwrap().unwrap().to_f32(), vec![2.0, 3.0, 4.0]);
    assert_eq!(b.unwrap().unwrap().to_f32(), vec![2.0, 3.0, 4.0]);
    let wrong = server
        .send(PushGradient {
            seen_version: 0,
            gradient: Params::from_f32(&[1.0; 3]),
        })
        .await
        .unwrap();
    assert!(wrong.unwrap_err().to_string().contains("synchronous"));
    let (version, params) = server.send(Pull).await.unwrap();
    assert_eq!((version, params.to_f32()), (1, vec![2.0, 3.0, 4.0]));
    server.kill().await.expect("killed");
}
