//! Hyperparameter search on the cluster: trials in real worker processes,
//! their files on disk.

use std::collections::BTreeSet;
use std::error::Error;
use std::time::Duration;

use nimbus::tune::{
    self, Metrics, Mode, ResultLine, SchedulerConfig, SearchSpace, Trainable, TrialContext,
    TrialStatus, TuneConfig, TuneError, Tuner, STATE_FILE,
};
use serde::Deserialize;

/// Trainables the tests register.
pub fn register(registry: nimbus::actor::Registry) -> nimbus::actor::Registry {
    use nimbus::tune::TuneRegistry;
    registry.trainable::<Quadratic>().trainable::<Flaky>()
}

#[derive(Deserialize)]
pub struct QuadraticConfig {
    x: f64,
}

/// Loss `(x − 3)² + 1/iteration` for 16 iterations, with the reporting
/// process's pid.
pub struct Quadratic;

impl Trainable for Quadratic {
    const NAME: &'static str = "tests.Quadratic";
    type Config = QuadraticConfig;
    fn run(
        config: QuadraticConfig,
        ctx: &mut TrialContext,
    ) -> Result<(), Box<dyn Error + Send + Sync>> {
        for i in 1..=16 {
            let loss = (config.x - 3.0).powi(2) + 1.0 / f64::from(i);
            ctx.report(Metrics::from([
                ("loss".into(), loss),
                ("pid".into(), f64::from(std::process::id())),
            ]))?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
pub struct FlakyConfig {
    mode: String,
}

/// Behaves as its mode says: `ok`, `panic`, `abort` (its process dies),
/// `hang` (never reports, never returns), `fail_once` (fails unless its
/// trial directory holds a marker from a previous attempt).
pub struct Flaky;

impl Trainable for Flaky {
    const NAME: &'static str = "tests.Flaky";
    type Config = FlakyConfig;
    fn run(
        config: FlakyConfig,
        ctx: &mut TrialContext,
    ) -> Result<(), Box<dyn Error + Send + Sync>> {
        ctx.report(Metrics::from([("score".into(), 1.0)]))?;
        match config.mode.as_str() {
            "panic" => panic!("flaky trial panics"),
            "abort" => std::process::abort(),
            "hang" => loop {
                std::thread::park();
            },
            "fail_once" => {
                let marker = ctx.trial_dir().join("failed-once");
                if !marker.exists() {
                    std::fs::write(&marker, b"")?;
                    return Err("first attempt fails".into());
                }
            }
            _ => {}
        }
        ctx.report(Metrics::from([("score".into(), 2.0)]))?;
        Ok(())
    }
}

pub async fn an_asha_experiment_stops_bad_trials_and_keeps_its_files() {
    let storage = tempfile::tempdir().unwrap();
    let space = SearchSpace::new().param("x", tune::uniform(0.0, 10.0));
    let config = TuneConfig::new("loss", Mode::Min)
        .num_samples(12)
        .max_concurrent_trials(3)
        .seed(11)
        .scheduler(SchedulerConfig::Asha {
            grace_period: 1,
            reduction_factor: 2.0,
            max_t: 16,
        });
    let grid = Tuner::<Quadratic>::new(space, config, "asha", storage.path())
        .fit()
        .await
        .unwrap();
    assert_eq!(grid.trials.len(), 12);
    let early: Vec<u64> = grid
        .trials
        .iter()
        .filter(|t| t.stopped_early)
        .map(|t| t.id)
        .collect();
    assert!(!early.is_empty(), "ASHA stopped some trials: {grid:?}");
    for t in &grid.trials {
        assert_eq!(t.status, TrialStatus::Terminated, "{t:?}");
        assert!(t.iterations >= 1 && t.iterations <= 16, "{t:?}");
        if t.stopped_early {
            assert!(t.iterations < 16, "stopped before max_t: {t:?}");
        }
    }
    // The trial nearest x = 3 is never below a rung's cutoff: it runs to
    // the end and is the best.
    let x = |t: &tune::TrialRecord| t.config["x"].as_f64().unwrap();
    let nearest = grid
        .trials
        .iter()
        .min_by(|a, b| (x(a) - 3.0).abs().total_cmp(&(x(b) - 3.0).abs()))
        .unwrap();
    assert_eq!(nearest.iterations, 16, "{nearest:?}");
    assert_eq!(grid.best_result().unwrap().id, nearest.id);
    // Twelve trials on three runners, reused: three worker processes.
    let pids: BTreeSet<u64> = grid
        .trials
        .iter()
        .map(|t| t.last.as_ref().unwrap()["pid"] as u64)
        .collect();
    assert!(pids.len() <= 3, "runners reused: {pids:?}");
    assert!(!pids.contains(&u64::from(std::process::id())));
    // The files: the state, and per trial its config and every result.
    let state: Vec<tune::TrialRecord> =
        serde_json::from_slice(&std::fs::read(grid.path.join(STATE_FILE)).unwrap()).unwrap();
    assert_eq!(state, grid.trials);
    for t in &grid.trials {
        let params: serde_json::Value =
            serde_json::from_slice(&std::fs::read(t.dir.join("params.json")).unwrap()).unwrap();
        assert_eq!(params["x"], t.config["x"]);
        let lines: Vec<ResultLine> = std::fs::read_to_string(t.dir.join(tune::RESULT_FILE))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len() as u64, t.iterations, "{t:?}");
        assert_eq!(lines.last().map(|l| &l.metrics), t.last.as_ref());
        let csv = std::fs::read_to_string(t.dir.join("progress.csv")).unwrap();
        assert_eq!(
            csv.lines().next(),
            Some("attempt,iteration,time_ms,loss,pid")
        );
        assert_eq!(csv.lines().count() as u64, t.iterations + 1);
    }
    let csv = grid.to_csv();
    assert_eq!(csv.lines().count(), 13);
}

pub async fn failed_hung_and_lost_trials_are_retried_then_named() {
    let storage = tempfile::tempdir().unwrap();
    let modes = ["ok", "panic", "abort", "hang", "fail_once"];
    let space = SearchSpace::new().param("mode", tune::grid(modes));
    let config = TuneConfig::new("score", Mode::Max)
        .max_concurrent_trials(3)
        .cpus_per_trial(0.5)
        .max_failures(1)
        .trial_timeout(Duration::from_secs(3));
    let grid = Tuner::<Flaky>::new(space, config, "flaky", storage.path())
        .fit()
        .await
        .unwrap();
    let by_mode = |mode: &str| {
        grid.trials
            .iter()
            .find(|t| t.config["mode"] == mode)
            .unwrap_or_else(|| panic!("a {mode} trial: {grid:?}"))
    };
    let ok = by_mode("ok");
    assert_eq!(
        (ok.status, ok.failures, ok.iterations),
        (TrialStatus::Terminated, 0, 2)
    );
    let once = by_mode("fail_once");
    assert_eq!(
        (once.status, once.failures, once.iterations),
        (TrialStatus::Terminated, 1, 2),
        "retried from the start: {once:?}"
    );
    let panicked = by_mode("panic");
    assert_eq!(
        (panicked.status, panicked.failures),
        (TrialStatus::Error, 2)
    );
    let why = panicked.error.as_deref().unwrap();
    assert!(why.contains("panic: flaky trial panics"), "{why}");
    let aborted = by_mode("abort");
    assert_eq!((aborted.status, aborted.failures), (TrialStatus::Error, 2));
    let why = aborted.error.as_deref().unwrap();
    assert!(why.contains("its runner died: killed by signal 6"), "{why}");
    // A hung trial is not retried: its runner is killed at the timeout.
    let hung = by_mode("hang");
    assert_eq!((hung.status, hung.failures), (TrialStatus::Error, 1));
    let why = hung.error.as_deref().unwrap();
    assert!(why.contains("trial_timeout (3s)"), "{why}");
    assert_eq!(grid.errors().count(), 3);
    // The retried trial's results carry their attempt.
    let lines: Vec<ResultLine> = std::fs::read_to_string(once.dir.join(tune::RESULT_FILE))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let attempts: Vec<(u32, u64)> = lines.iter().map(|l| (l.attempt, l.iteration)).collect();
    assert_eq!(attempts, [(0, 1), (1, 1), (1, 2)]);
}

pub async fn bad_experiments_fail_at_once_naming_the_problem() {
    let storage = tempfile::tempdir().unwrap();
    let space = || SearchSpace::new().param("x", tune::uniform(0.0, 1.0));
    // A metric the trainable does not report.
    let config = TuneConfig::new("accuracy", Mode::Max).num_samples(4);
    match Tuner::<Quadratic>::new(space(), config, "metric", storage.path())
        .fit()
        .await
    {
        Err(TuneError::UnknownMetric {
            metric, reported, ..
        }) => {
            assert_eq!(metric, "accuracy");
            assert_eq!(reported, ["loss", "pid"]);
        }
        other => panic!("expected UnknownMetric, got {other:?}"),
    }
    // A bad space: refused before anything is created.
    let bad = SearchSpace::new().param("lr", tune::loguniform(0.0, 1.0));
    let config = TuneConfig::new("loss", Mode::Min);
    let refused = Tuner::<Quadratic>::new(bad, config.clone(), "space", storage.path())
        .fit()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, TuneError::BadSpace { param, .. } if param == "lr"),
        "{refused}"
    );
    assert!(!storage.path().join("space").exists());
    let empty = SearchSpace::new().param("batch", tune::choice(Vec::<u32>::new()));
    let refused = Tuner::<Quadratic>::new(empty, config.clone(), "space", storage.path())
        .fit()
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("\"batch\" has no values"),
        "{refused}"
    );
    // An experiment directory in use.
    let refused = Tuner::<Quadratic>::new(space(), config, "metric", storage.path())
        .fit()
        .await
        .unwrap_err();
    assert!(
        matches!(refused, TuneError::ExperimentExists(_)),
        "{refused}"
    );
}
