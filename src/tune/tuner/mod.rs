//! The tuner: the driver's loop that runs an experiment.
//!
//! 1. Check the search space and settings; create the experiment directory
//!    (refused if it holds an experiment already).
//! 2. Start `min(max_concurrent_trials, trials)` [`TrialRunner`] actors,
//!    each with `cpus_per_trial` CPUs, so trials queue rather than
//!    oversubscribe the cluster; the runners are reused from trial to
//!    trial.
//! 3. While a runner is idle and the time budget lasts, give it the next
//!    trial: a failed one due for a retry first, else the searcher's next
//!    config. A task per running trial long-polls its results
//!    ([`POLL_WAIT`]), forwards them and waits for the loop's decision
//!    before its next poll lets the trial go on (`trial.rs`, step 2).
//! 4. Each result is written to the trial's files, checked for the
//!    experiment's metric (missing: the experiment ends with
//!    `UnknownMetric`), and given to the scheduler; a `Stop` (or the
//!    trial reaching `stop_iterations`) has the task send `StopTrial`
//!    first.
//! 5. A trial that ends by returning is `Terminated` (so is one told to
//!    stop that fails on its way out); one that fails is retried from its
//!    newest checkpoint (the start without one) while its failures are
//!    within `max_failures`, else `Error`. A runner that refuses a trial
//!    or a config the trainable cannot decode ends the experiment
//!    (`Refused`, `BadConfig`). A trial running past `trial_timeout` is told to stop
//!    (`StopTrial`, so that it can free what it holds, as a whole training
//!    run does) and ends in `Error`, naming the timeout; if it has not
//!    ended [`TIMEOUT_GRACE`] later, its runner is killed (and replaced). A
//!    trial that panicked or whose runner died counts a failure, named by
//!    the panic or the death's cause. A runner is replaced in the
//!    background (its slot takes no trial meanwhile; the loop goes on).
//! 6. When the time budget is spent, running trials are told to stop and
//!    no run starts (retries due end in `Error`); trials still running
//!    [`BUDGET_GRACE`] later have their runners killed and end
//!    `Terminated`. When no trial runs and none is left, the runners are
//!    killed and the [`ResultGrid`] returned. `experiment_state.json` is
//!    rewritten at once when a trial ends or is due for a retry, after
//!    trials start (at most every [`STATE_EVERY`]), and at the end.
//!
//! [`Tuner::restore`] resumes an experiment from its directory.
//!
//! The rooms: this file starts and restores an experiment;
//! `event_loop.rs` is its loop (steps 2, 3 and 6), `follow.rs` the task
//! per running trial (step 3), `outcomes.rs` what its results and end
//! decide (steps 4 and 5).

mod event_loop;
mod follow;
mod outcomes;

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::checkpoint::{self, TrialCheckpoint};
use super::config::TuneConfig;
use super::experiment::{ExperimentFiles, ResultGrid, TrialRecord, TrialStatus};
use super::schedule::{Decision, Scheduler};
use super::search::Searcher;
use super::space::SearchSpace;
use super::trial::{Trainable, TrialEnd, TrialResult, TrialRunner};
use super::TuneError;
use crate::actor::ActorHandle;
use event_loop::Experiment;
use follow::at_max_t;

/// How long a runner holds a results poll open when there is no news.
pub const POLL_WAIT: Duration = Duration::from_secs(1);
/// How long a poll may take beyond its wait before the runner counts as
/// lost.
pub const POLL_DEADLINE: Duration = Duration::from_secs(30);
/// `experiment_state.json` is rewritten at most this often while trials
/// run (and once at the end).
pub const STATE_EVERY: Duration = Duration::from_millis(500);
/// How long the tuner waits for the head's record of a lost runner's
/// death, to name its cause.
pub const DEATH_WAIT: Duration = Duration::from_secs(5);
/// How long trials have to stop (at their next report) once the time
/// budget ran out, before their runners are killed.
pub const BUDGET_GRACE: Duration = Duration::from_secs(10);
/// How long a trial past its `trial_timeout` has to stop (a trainable
/// that stops resources of its own, as a whole training run, frees them),
/// before its runner is killed.
pub const TIMEOUT_GRACE: Duration = Duration::from_secs(5);

/// Runs an experiment of `T` trials; see the module docs.
pub struct Tuner<T: Trainable> {
    space: SearchSpace,
    config: TuneConfig,
    dir: PathBuf,
    /// Resume the experiment in `dir` rather than start one.
    restore: bool,
    _trainable: PhantomData<fn() -> T>,
}

/// A runner and the trial it runs.
struct Slot {
    runner: SlotRunner,
    running: Option<Running>,
}

/// A slot's runner.
enum SlotRunner {
    Ready(ActorHandle<TrialRunner>),
    /// Being replaced (`Event::Replaced` follows).
    Starting,
    /// Could not be replaced.
    Gone,
}

/// A trial on a runner.
struct Running {
    trial: u64,
    /// Numbers the run, so that news of an earlier one is told apart.
    run: u64,
    started: Instant,
    /// It was told to stop (its end is no failure to retry).
    stop_sent: bool,
    /// It ran past `trial_timeout` before anything else told it to stop:
    /// it ends in `Error`, however it ends.
    timed_out: bool,
    /// Past its `trial_timeout`: when its runner is killed unless it has
    /// ended ([`TIMEOUT_GRACE`] after the timeout).
    kill_at: Option<Instant>,
}

/// What the tasks of the experiment tell its loop.
enum Event {
    /// Run `.0`'s new results, and where to say whether the trial stops.
    Results(u64, Vec<TrialResult>, oneshot::Sender<bool>),
    /// Run `.0` ended, or its runner was lost (`Err`: why).
    Ended(u64, Result<TrialEnd, String>),
    /// Slot `.0`'s runner was replaced (or could not be).
    Replaced(usize, Result<ActorHandle<TrialRunner>, String>),
    /// A runner that could not be killed (tried again at the end).
    Unkilled(ActorHandle<TrialRunner>),
}

impl<T: Trainable> Tuner<T> {
    /// An experiment named `name`, its files under `storage_path/name/`.
    pub fn new(
        space: SearchSpace,
        config: TuneConfig,
        name: impl AsRef<str>,
        storage_path: impl Into<PathBuf>,
    ) -> Self {
        Tuner {
            space,
            config,
            dir: storage_path.into().join(name.as_ref()),
            restore: false,
            _trainable: PhantomData,
        }
    }

    /// Resumes the experiment in `path` (an earlier `fit` whose driver
    /// died or was stopped), given the search space and settings it was
    /// started with: trials that ended stay as they are; trials that were
    /// running or pending (and those started after the state file was
    /// last written, found by their `params.json`) run again, each from
    /// the newest checkpoint its results name (from the start without
    /// one); the searcher draws again the configs the experiment drew
    /// (seeded) and is told the results of the trials that ended (in the
    /// order they ended), then goes on; the scheduler is given every
    /// result recorded so far first (in the order they arrived).
    pub fn restore(path: impl Into<PathBuf>, space: SearchSpace, config: TuneConfig) -> Self {
        Tuner {
            space,
            config,
            dir: path.into(),
            restore: true,
            _trainable: PhantomData,
        }
    }

    /// Runs the experiment to its end; see the module docs.
    pub async fn fit(self) -> Result<ResultGrid, TuneError> {
        let started = Instant::now();
        self.space.validate()?;
        self.config.validate()?;
        let mut scheduler = self.config.scheduler.build(self.config.seed)?;
        let mut search = self.config.search.build(
            self.space.clone(),
            self.config.num_samples,
            self.config.seed,
        )?;
        let (files, trials, retry) = if self.restore {
            let files = ExperimentFiles::open(self.dir.clone())?;
            let (trials, retry) = resume(&files, &mut *search, &mut *scheduler, &self.config)?;
            (files, trials, retry)
        } else {
            (
                ExperimentFiles::create(self.dir.clone())?,
                Vec::new(),
                VecDeque::new(),
            )
        };
        let left = search.total().map_or(usize::MAX, |total| {
            total.saturating_sub(trials.len()) + retry.len()
        });
        let wanted = left.min(self.config.max_concurrent_trials);
        let mut run = Experiment::new(self.config, search, scheduler, files, started, T::NAME);
        run.trials = trials;
        run.retry = retry;
        let outcome = match run.start_runners(wanted).await {
            Ok(()) => run.run().await,
            Err(e) => Err(e),
        };
        run.stop_runners().await;
        run.to_head.finish_all().await;
        let written = run.files.write_state(&run.trials);
        outcome?;
        written?;
        Ok(ResultGrid {
            path: run.files.dir().to_path_buf(),
            metric: run.config.metric.clone(),
            mode: run.config.mode,
            trials: std::mem::take(&mut run.trials),
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// An earlier run's trials, and those to run again (`Tuner::restore`).
fn resume(
    files: &ExperimentFiles,
    search: &mut dyn Searcher,
    scheduler: &mut dyn Scheduler,
    config: &TuneConfig,
) -> Result<(Vec<TrialRecord>, VecDeque<u64>), TuneError> {
    let mut trials = files.read_state()?;
    let unrecorded = files.read_unrecorded(trials.len() as u64);
    trials.extend(unrecorded);
    // The configs already drawn: the searcher draws them again (seeded),
    // so that it goes on where it was.
    let differ = trials
        .iter()
        .filter(|trial| search.suggest().as_ref() != Some(&trial.config))
        .count();
    search.restored();
    if differ > 0 {
        tracing::warn!(
            "{differ} recorded trial configs are not what the searcher draws now (expected of a model-based searcher, whose draws depend on the results it saw; else the search space or seed changed): the remaining trials come from the searcher given now"
        );
    }
    let mut retry = VecDeque::new();
    let mut results = Vec::new();
    // Each trial's last result: when, and its metric.
    let mut last: HashMap<u64, (u64, Option<f64>)> = HashMap::new();
    for trial in &mut trials {
        let lines = files.read_results(&trial.dir)?;
        if let Some(line) = lines.last() {
            let value = line.metrics.get(&config.metric).copied();
            last.insert(trial.id, (line.time_ms, value));
        }
        if matches!(trial.status, TrialStatus::Running | TrialStatus::Pending) {
            trial.status = TrialStatus::Pending;
            retry.push_back(trial.id);
            // The state file is not rewritten at every result: the newest
            // checkpoint is the last one its results name.
            if let Some(line) = lines.iter().rev().find(|l| l.checkpoint.is_some()) {
                trial.checkpoint = Some(TrialCheckpoint {
                    iteration: line.iteration,
                    path: trial.dir.join(checkpoint::directory_name(line.iteration)),
                });
            }
        }
        results.extend(lines);
    }
    for trial in &trials {
        scheduler.on_trial_add(trial.id, &trial.config);
    }
    results.sort_by_key(|l| (l.time_ms, l.trial, l.iteration));
    // A stop decided before the driver died still holds.
    let mut stopped: HashMap<u64, bool> = HashMap::new();
    for line in results {
        let Some(value) = line.metrics.get(&config.metric) else {
            continue;
        };
        let decision = scheduler.on_result(line.trial, line.iteration, config.mode.score(*value));
        let done = config.stop_iterations.is_some_and(|n| line.iteration >= n);
        if decision == Decision::Stop || done {
            let early = decision == Decision::Stop && !done && !at_max_t(config, line.iteration);
            stopped.insert(line.trial, early);
        } else {
            stopped.remove(&line.trial);
        }
    }
    retry.retain(|id| {
        let Some(&early) = stopped.get(id) else {
            return true;
        };
        let trial = &mut trials[*id as usize];
        trial.status = TrialStatus::Terminated;
        trial.stopped_early = early;
        false
    });
    // The searcher learns from the ended trials, in the order they ended,
    // as it did while they ran (`settle`).
    let mut ended: Vec<(u64, &TrialRecord)> = trials
        .iter()
        .filter(|t| t.status == TrialStatus::Terminated)
        .map(|t| (last.get(&t.id).map_or(0, |(time, _)| *time), t))
        .collect();
    ended.sort_by_key(|(time, t)| (*time, t.id));
    for (_, trial) in ended {
        let value = match last.get(&trial.id) {
            Some((_, value)) => *value,
            None => trial
                .last
                .as_ref()
                .and_then(|l| l.get(&config.metric).copied()),
        };
        search.on_trial_complete(&trial.config, value.map(|v| config.mode.score(v)));
    }
    Ok((trials, retry))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::tune::experiment::ResultLine;
    use crate::tune::schedule::Fifo;
    use crate::tune::search::TrialConfig;
    use crate::tune::{Metrics, Mode};

    /// What a searcher was told of ended trials: config and score.
    type Told = Arc<Mutex<Vec<(TrialConfig, Option<f64>)>>>;

    /// Draws `x` = 0, 1, 2, … and records what it is told of ended trials.
    struct Recording {
        drawn: u64,
        told: Told,
    }

    impl Searcher for Recording {
        fn suggest(&mut self) -> Option<TrialConfig> {
            let config = TrialConfig::from_iter([("x".to_string(), self.drawn.into())]);
            self.drawn += 1;
            Some(config)
        }
        fn total(&self) -> Option<usize> {
            None
        }
        fn on_trial_complete(&mut self, config: &TrialConfig, score: Option<f64>) {
            self.told.lock().unwrap().push((config.clone(), score));
        }
    }

    #[test]
    fn a_restored_searcher_learns_the_ended_trials_in_the_order_they_ended() {
        let storage = tempfile::tempdir().unwrap();
        let dir = storage.path().join("exp");
        let told = Arc::new(Mutex::new(Vec::new()));
        let mut search = Recording {
            drawn: 0,
            told: told.clone(),
        };
        let mut files = ExperimentFiles::create(dir.clone()).unwrap();
        // Trials 0 and 2 ended (2 first), 1 still ran, 3 failed for good.
        let statuses = [
            TrialStatus::Terminated,
            TrialStatus::Running,
            TrialStatus::Terminated,
            TrialStatus::Error,
        ];
        let mut trials = Vec::new();
        for (id, status) in statuses.into_iter().enumerate() {
            let mut trial = TrialRecord::new(id as u64, search.suggest().unwrap(), &dir);
            trial.status = status;
            files.trial_started(&trial).unwrap();
            trials.push(trial);
        }
        let ended_at = [(0, 300, 0.5), (1, 100, 0.7), (2, 200, 0.25), (3, 50, 0.9)];
        for (trial, time_ms, loss) in ended_at {
            let line = ResultLine {
                trial,
                attempt: 0,
                iteration: 1,
                time_ms,
                metrics: Metrics::from([("loss".to_string(), loss)]),
                checkpoint: None,
            };
            files.result(&trials[trial as usize].dir, &line).unwrap();
        }
        files.write_state(&trials).unwrap();
        drop(files);

        let files = ExperimentFiles::open(dir).unwrap();
        let config = TuneConfig::new("loss", Mode::Min);
        let mut search = Recording {
            drawn: 0,
            told: told.clone(),
        };
        told.lock().unwrap().clear();
        let (trials, retry) = resume(&files, &mut search, &mut Fifo, &config).unwrap();
        assert_eq!(retry, [1]);
        assert_eq!(search.drawn, 4, "the recorded draws were replayed");
        let told = told.lock().unwrap().clone();
        let x = |t: &(TrialConfig, Option<f64>)| t.0["x"].as_u64().unwrap();
        assert_eq!(told.iter().map(x).collect::<Vec<_>>(), [2, 0]);
        // Scores are higher-is-better: the negated losses.
        assert_eq!(told[0].1, Some(-0.25));
        assert_eq!(told[1].1, Some(-0.5));
        assert_eq!(trials[3].status, TrialStatus::Error);
    }
}
