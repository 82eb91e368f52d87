//! Tune trials that are whole training runs (`nimbus_train::tune`): each
//! trial a `Trainer` with its own workers, stopped by the tuner, retried
//! from its checkpoint.

use std::path::Path;
use std::time::Duration;

use nimbus::train::faults::{TrainingFault, TrainingFaultAction};
use nimbus::tune::{self, Mode, ResultLine, SearchSpace, TrialStatus, TuneConfig, Tuner};
use nimbus_train::tune::{TrainerTrainable, TunedLoop};
use nimbus_train::{LoopResult, RunConfig, ScalingConfig, TrainContext, TrainLoop};
use serde::{Deserialize, Serialize};

use crate::mnist::{DataSource, MnistConfig, MnistLoop};

/// The MNIST loop, tuned: learning rate, workers, length.
pub struct TunedMnist;

/// A trial's config.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TunedMnistConfig {
    lr: f64,
    workers: usize,
    max_steps: u64,
    /// On the trial's first run only: rank 0 panics at this step.
    panic_at: Option<u64>,
}

impl TrainLoop for TunedMnist {
    const NAME: &'static str = "tests.TunedMnist";
    type Config = TunedMnistConfig;

    fn run(config: TunedMnistConfig, ctx: &mut TrainContext) -> LoopResult {
        let mnist = MnistConfig {
            epochs: 100,
            batch_size: 32,
            lr: config.lr,
            seed: 7,
            data: DataSource::Embedded {
                train: 1_280,
                test: 200,
            },
            checkpoint_every: Some(3),
            max_steps: Some(config.max_steps),
            ..MnistConfig::default()
        };
        MnistLoop::run(mnist, ctx)
    }
}

impl TunedLoop for TunedMnist {
    fn scaling(config: &TunedMnistConfig) -> ScalingConfig {
        ScalingConfig::workers(config.workers)
    }

    fn run_config(config: &TunedMnistConfig, dir: &Path) -> RunConfig {
        let run = RunConfig::new("train", dir)
            .collective_timeout(Duration::from_secs(20))
            .placement_timeout(Duration::from_secs(60));
        let first_run = dir.ends_with("run-0");
        match config.panic_at {
            Some(step) if first_run => run.inject(TrainingFault {
                rank: 0,
                at_step: step,
                action: TrainingFaultAction::Panic,
            }),
            _ => run,
        }
    }
}

fn results(dir: &Path) -> Vec<ResultLine> {
    std::fs::read_to_string(dir.join(tune::RESULT_FILE))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// CPUs in use in the cluster.
async fn cpus_used(driver: &mut nimbus::Driver) -> f64 {
    let client = driver.local_cluster().unwrap().client().await.unwrap();
    let status = client.status().await.unwrap();
    status.alive().map(|n| n.resources.used.amount("CPU")).sum()
}

/// No training worker is alive, and the CPUs in use are back to `before`
/// or below (the runs' placement groups removed; an earlier test's
/// resources may have been freed meanwhile).
async fn nothing_left(driver: &mut nimbus::Driver, before: f64) {
    let client = driver.local_cluster().unwrap().client().await.unwrap();
    let actors = client.actors().await.unwrap();
    let workers: Vec<_> = actors
        .iter()
        .filter(|a| a.type_name.contains("TrainerWorker") && a.dead.is_none())
        .collect();
    assert!(workers.is_empty(), "training workers left: {workers:?}");
    let freed = client
        .wait_for_status("the runs' CPUs free again", Duration::from_secs(20), |s| {
            let used: f64 = s.alive().map(|n| n.resources.used.amount("CPU")).sum();
            used <= before + 1e-6
        })
        .await;
    if let Err(e) = freed {
        let status = client.status().await.unwrap();
        panic!("{e}: {before} CPUs in use before, now: {status:#?}");
    }
}

/// Four trials of two workers each, two at a time, each stopped by the
/// tuner after 5 results of a run that would go on for 2,000 steps: each
/// trial trains in its own run directory, the stop ends the run, and no
/// worker or placement group outlives the experiment.
pub async fn tune_trials_are_whole_training_runs_and_stop(driver: &mut nimbus::Driver) {
    let storage = tempfile::tempdir().unwrap();
    let before = cpus_used(driver).await;
    let space = SearchSpace::new()
        .param("lr", tune::grid([0.01, 0.05, 0.1, 0.2]))
        .param("workers", tune::constant(2))
        .param("max_steps", tune::constant(2_000))
        .param("panic_at", tune::constant(None::<u64>));
    let config = TuneConfig::new("loss", Mode::Min)
        .max_concurrent_trials(2)
        .cpus_per_trial(0.0)
        .stop_iterations(5);
    let grid = Tuner::<TrainerTrainable<TunedMnist>>::new(space, config, "runs", storage.path())
        .fit()
        .await
        .unwrap();
    assert_eq!(grid.trials.len(), 4);
    if grid.errors().next().is_some() {
        let client = driver.local_cluster().unwrap().client().await.unwrap();
        panic!("{:#?}\n{grid:#?}", client.status().await.unwrap());
    }
    for trial in &grid.trials {
        assert_eq!(trial.status, TrialStatus::Terminated, "{trial:?}");
        assert_eq!(trial.iterations, 5, "{trial:?}");
        let steps: Vec<f64> = results(&trial.dir)
            .iter()
            .map(|r| r.metrics["step"])
            .collect();
        assert_eq!(steps, [1.0, 2.0, 3.0, 4.0, 5.0], "trial {}", trial.id);
        // Its own run, stopped long before its 2,000 steps.
        let run_dir = trial.dir.join("run-0").join("train");
        let reports = nimbus_train::results::read_reports(&run_dir).unwrap();
        assert!(
            (5..1_000).contains(&reports.len()),
            "trial {}: {} reports",
            trial.id,
            reports.len()
        );
        assert!(run_dir.join("checkpoint_000000003").is_dir(), "{run_dir:?}");
    }
    nothing_left(driver, before).await;
}

/// A trial whose run fails (rank 0 panics at step 8; the run itself has no
/// restarts) is retried by the tuner from its tune checkpoint, which names
/// the run's newest checkpoint: the retry goes on right after it, in a
/// run directory of its own.
pub async fn a_failed_trainer_trial_resumes_from_its_checkpoint(driver: &mut nimbus::Driver) {
    let storage = tempfile::tempdir().unwrap();
    let before = cpus_used(driver).await;
    let space = SearchSpace::new()
        .param("lr", tune::constant(0.05))
        .param("workers", tune::constant(2))
        .param("max_steps", tune::constant(12))
        .param("panic_at", tune::constant(8));
    let config = TuneConfig::new("loss", Mode::Min)
        .cpus_per_trial(0.0)
        .max_failures(1);
    let grid = Tuner::<TrainerTrainable<TunedMnist>>::new(space, config, "retry", storage.path())
        .fit()
        .await
        .unwrap();
    let trial = &grid.trials[0];
    assert_eq!(trial.status, TrialStatus::Terminated, "{trial:?}");
    assert_eq!((trial.failures, trial.runs), (1, 2), "{trial:?}");
    let lines = results(&trial.dir);
    for line in &lines {
        assert_eq!(line.iteration as f64, line.metrics["step"], "{lines:?}");
    }
    // The retry starts right after a checkpoint of the first run (3 or 6:
    // 6 unless the panic beat its write), not from the start.
    let retried: Vec<u64> = lines
        .iter()
        .filter(|l| l.attempt == 1)
        .map(|l| l.iteration)
        .collect();
    let from = retried.first().copied().unwrap_or_default();
    assert!(from == 4 || from == 7, "{lines:?}");
    assert_eq!(retried, (from..=12).collect::<Vec<_>>(), "{lines:?}");
    assert!(
        trial.dir.join("run-1/train").is_dir(),
        "the retry's own run"
    );
    nothing_left(driver, before).await;
}

/// A trial past its `trial_timeout` is told to stop: its run's workers and
/// placement group are freed (nothing killed the runner's process under
/// them), and it ends in `Error`, naming the timeout.
pub async fn a_trainer_trial_past_its_timeout_frees_its_run(driver: &mut nimbus::Driver) {
    let storage = tempfile::tempdir().unwrap();
    let before = cpus_used(driver).await;
    let space = SearchSpace::new()
        .param("lr", tune::constant(0.05))
        .param("workers", tune::constant(2))
        .param("max_steps", tune::constant(100_000))
        .param("panic_at", tune::constant(None::<u64>));
    let config = TuneConfig::new("loss", Mode::Min)
        .cpus_per_trial(0.0)
        .trial_timeout(Duration::from_secs(4));
    let grid = Tuner::<TrainerTrainable<TunedMnist>>::new(space, config, "timeout", storage.path())
        .fit()
        .await
        .unwrap();
    let trial = &grid.trials[0];
    assert_eq!(trial.status, TrialStatus::Error, "{trial:?}");
    let why = trial.error.as_deref().unwrap();
    assert!(
        why.contains("trial_timeout (4s)") && why.contains("was stopped"),
        "{why}"
    );
    nothing_left(driver, before).await;
}
