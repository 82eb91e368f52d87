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

use std::collections::{HashMap, HashSet, VecDeque};
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::checkpoint::{self, TrialCheckpoint};
use super::config::TuneConfig;
use super::experiment::{
    ExperimentFiles, ExploitRecord, ResultGrid, ResultLine, TrialRecord, TrialStatus,
};
use super::progress::progress_table;
use super::schedule::{Decision, Scheduler};
use super::search::{Searcher, TrialConfig};
use super::space::SearchSpace;
use super::to_head::TrialReports;
use super::trial::{
    PollTrial, RunTrial, StopTrial, Trainable, TrialEnd, TrialProgress, TrialRefusal, TrialResult,
    TrialRunner,
};
use super::TuneError;
use crate::actor::{self, ActorHandle, CallError, SpawnOptions};
use crate::library::now_ms;

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

/// A running experiment.
struct Experiment {
    config: TuneConfig,
    search: Box<dyn Searcher>,
    scheduler: Box<dyn Scheduler>,
    files: ExperimentFiles,
    trials: Vec<TrialRecord>,
    /// Trials due for another run: failed, or stopped for an exploit.
    retry: VecDeque<u64>,
    /// Trials stopped for an exploit, not yet ended.
    exploiting: HashSet<u64>,
    /// Never removed from, so that an index names a slot for good.
    slots: Vec<Slot>,
    /// Runners whose kill failed: killed again at the end.
    unkilled: Vec<ActorHandle<TrialRunner>>,
    /// The runners are stopped (else dropping the experiment stops them).
    stopped: bool,
    next_run: u64,
    /// A trial's record changed since `experiment_state.json` was written.
    dirty: bool,
    /// When it was last written.
    last_state_write: Option<Instant>,
    /// When the progress table was last shown.
    last_progress: Option<Instant>,
    events: (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>),
    /// When the time budget ran out (running trials were told to stop).
    budget_over: Option<Instant>,
    started: Instant,
    trainable: &'static str,
    /// What the head is told of the trials (`to_head.rs`).
    to_head: TrialReports,
}

impl Drop for Experiment {
    /// A `fit` future dropped before its end (cancelled) still stops its
    /// runners.
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for runner in self.runners() {
            runtime.spawn(async move { runner.kill().await });
        }
    }
}

impl Experiment {
    fn new(
        config: TuneConfig,
        search: Box<dyn Searcher>,
        scheduler: Box<dyn Scheduler>,
        files: ExperimentFiles,
        started: Instant,
        trainable: &'static str,
    ) -> Self {
        let name = files
            .dir()
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        Experiment {
            to_head: TrialReports::new(name),
            config,
            search,
            scheduler,
            files,
            trials: Vec::new(),
            retry: VecDeque::new(),
            exploiting: HashSet::new(),
            slots: Vec::new(),
            unkilled: Vec::new(),
            stopped: false,
            next_run: 0,
            dirty: false,
            last_state_write: None,
            last_progress: None,
            events: mpsc::unbounded_channel(),
            budget_over: None,
            started,
            trainable,
        }
    }

    /// Every runner started and not known dead.
    fn runners(&self) -> Vec<ActorHandle<TrialRunner>> {
        let ready = self.slots.iter().filter_map(|s| match &s.runner {
            SlotRunner::Ready(runner) => Some(runner.clone()),
            _ => None,
        });
        ready.chain(self.unkilled.iter().cloned()).collect()
    }

    /// Step 2: `wanted` runners; the first that cannot start fails the
    /// experiment (after the others are stopped).
    async fn start_runners(&mut self, wanted: usize) -> Result<(), TuneError> {
        let options = SpawnOptions::default().num_cpus(self.config.cpus_per_trial);
        let spawned = futures::future::join_all(
            (0..wanted).map(|_| actor::spawn::<TrialRunner>((), options.clone())),
        )
        .await;
        let mut refused = None;
        for s in spawned {
            match s {
                Ok(runner) => self.slots.push(Slot {
                    runner: SlotRunner::Ready(runner),
                    running: None,
                }),
                Err(e) => refused = Some(e),
            }
        }
        match refused {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Kills every runner (at the end).
    async fn stop_runners(&mut self) {
        let runners = self.runners();
        let kills = runners.iter().map(|r| r.kill());
        for (runner, killed) in runners.iter().zip(futures::future::join_all(kills).await) {
            if let Err(e) = killed {
                tracing::warn!(runner = %runner.id(), "cannot stop a trial runner: {e}");
            }
        }
        self.stopped = true;
    }

    async fn run(&mut self) -> Result<(), TuneError> {
        loop {
            self.assign()?;
            let busy = self
                .slots
                .iter()
                .any(|s| s.running.is_some() || matches!(s.runner, SlotRunner::Starting));
            if !busy {
                if self.has_work() && !self.slots.is_empty() && self.budget_over.is_none() {
                    return Err(TuneError::RunnersLost(
                        "no trial runner is left to run the remaining trials".into(),
                    ));
                }
                return Ok(());
            }
            self.write_state_due()?;
            let event = match self.next_deadline() {
                Some(at) => tokio::time::timeout_at(at.into(), self.events.1.recv())
                    .await
                    .ok()
                    .flatten(),
                None => self.events.1.recv().await,
            };
            if let Some(event) = event {
                self.handle(event)?;
            }
            // Events already in (an end) come before a timeout.
            while let Ok(event) = self.events.1.try_recv() {
                self.handle(event)?;
            }
            self.check_time()?;
            self.show_progress();
        }
    }

    fn handle(&mut self, event: Event) -> Result<(), TuneError> {
        match event {
            Event::Results(run, results, decided) => {
                let stop = self.results(run, results)?;
                if stop {
                    self.stop_sent(run);
                }
                // A trial whose follower is gone has ended or timed out.
                let _ = decided.send(stop);
                Ok(())
            }
            Event::Ended(run, end) => self.ended(run, end),
            Event::Replaced(slot, replaced) => {
                match replaced {
                    Ok(runner) => self.slots[slot].runner = SlotRunner::Ready(runner),
                    Err(e) => {
                        tracing::warn!("a trial runner could not be replaced: {e}");
                        self.slots[slot].runner = SlotRunner::Gone;
                    }
                }
                Ok(())
            }
            Event::Unkilled(runner) => {
                self.unkilled.push(runner);
                Ok(())
            }
        }
    }

    /// Whether trials are left to start (retries or new ones).
    fn has_work(&self) -> bool {
        !self.retry.is_empty()
            || self
                .search
                .total()
                .is_none_or(|total| self.trials.len() < total)
    }

    /// Step 3: give idle runners trials.
    fn assign(&mut self) -> Result<(), TuneError> {
        if self.budget_over.is_some() {
            // Nothing starts any more: retries due end here.
            while let Some(trial) = self.retry.pop_front() {
                let record = &mut self.trials[trial as usize];
                let why = "the experiment's time_budget ran out before its next run";
                record.status = TrialStatus::Error;
                record.error = Some(why.into());
                self.to_head.finished(record, Some(why.into()));
                self.search.on_trial_complete(&record.config, None);
                self.changed();
            }
            return Ok(());
        }
        loop {
            let idle = self
                .slots
                .iter()
                .position(|s| s.running.is_none() && matches!(s.runner, SlotRunner::Ready(_)));
            let Some(slot) = idle else {
                return Ok(());
            };
            let trial = match self.retry.pop_front() {
                Some(trial) => trial,
                None => match self.search.suggest() {
                    Some(config) => {
                        let id = self.trials.len() as u64;
                        self.trials
                            .push(TrialRecord::new(id, config, self.files.dir()));
                        id
                    }
                    None => return Ok(()),
                },
            };
            self.start(slot, trial)?;
        }
    }

    fn start(&mut self, slot: usize, trial: u64) -> Result<(), TuneError> {
        let SlotRunner::Ready(runner) = &self.slots[slot].runner else {
            return Ok(());
        };
        let runner = runner.clone();
        let record = &mut self.trials[trial as usize];
        self.scheduler.on_trial_add(trial, &record.config);
        record.status = TrialStatus::Running;
        record.runs += 1;
        record.iterations = record.checkpoint.as_ref().map_or(0, |c| c.iteration);
        self.files.trial_started(record)?;
        self.to_head.started(record);
        let request = RunTrial {
            trial,
            trainable: self.trainable.to_string(),
            config: serde_json::Value::Object(record.config.clone()).to_string(),
            dir: record.dir.clone(),
            resume: record.checkpoint.clone(),
        };
        let run = self.next_run;
        self.next_run += 1;
        self.slots[slot].running = Some(Running {
            trial,
            run,
            started: Instant::now(),
            stop_sent: false,
            timed_out: false,
            kill_at: None,
        });
        tokio::spawn(follow(runner, request, run, self.events.0.clone()));
        self.changed();
        Ok(())
    }

    /// A trial's record changed.
    fn changed(&mut self) {
        self.dirty = true;
    }

    /// When `experiment_state.json` is to be written next after a trial
    /// started: at once, unless the last write is younger than
    /// [`STATE_EVERY`] (an experiment of many short trials does not rewrite
    /// it for each). Ends and retries are written at once.
    fn state_due(&self) -> Option<Instant> {
        let now = Instant::now();
        self.dirty.then(|| {
            self.last_state_write
                .and_then(|at| at.checked_add(STATE_EVERY))
                .map_or(now, |at| at.max(now))
        })
    }

    fn write_state_due(&mut self) -> Result<(), TuneError> {
        if self.state_due().is_some_and(|at| at <= Instant::now()) {
            self.write_state()?;
        }
        Ok(())
    }

    fn write_state(&mut self) -> Result<(), TuneError> {
        self.files.write_state(&self.trials)?;
        self.dirty = false;
        self.last_state_write = Some(Instant::now());
        Ok(())
    }

    fn slot_of(&self, run: u64) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.running.as_ref().is_some_and(|r| r.run == run))
    }

    /// Run `run` was told to stop: its end is no failure to retry.
    fn stop_sent(&mut self, run: u64) {
        if let Some(slot) = self.slot_of(run) {
            if let Some(running) = &mut self.slots[slot].running {
                running.stop_sent = true;
            }
        }
    }

    /// Step 4: whether the trial stops.
    fn results(&mut self, run: u64, results: Vec<TrialResult>) -> Result<bool, TuneError> {
        let Some(slot) = self.slot_of(run) else {
            return Ok(true);
        };
        let Some(trial) = self.slots[slot].running.as_ref().map(|r| r.trial) else {
            return Ok(true);
        };
        let mut stop = false;
        for TrialResult {
            metrics,
            checkpoint,
        } in results
        {
            let record = &mut self.trials[trial as usize];
            let Some(&value) = metrics.get(&self.config.metric) else {
                return Err(TuneError::UnknownMetric {
                    metric: self.config.metric.clone(),
                    trial,
                    reported: metrics.keys().cloned().collect(),
                });
            };
            record.iterations += 1;
            let line = ResultLine {
                trial,
                attempt: record.runs.saturating_sub(1),
                iteration: record.iterations,
                time_ms: now_ms(),
                metrics: metrics.clone(),
                checkpoint: checkpoint.as_ref().map(|c| c.path.clone()),
            };
            if checkpoint.is_some() {
                record.checkpoint = checkpoint;
            }
            self.files.result(&record.dir, &line)?;
            self.to_head.result(record, &line);
            let mode = self.config.mode;
            let best = record
                .best
                .as_ref()
                .and_then(|b| b.get(&self.config.metric));
            let better = match best {
                None => true,
                Some(best) if best.is_nan() => true,
                Some(best) => !value.is_nan() && mode.score(value) > mode.score(*best),
            };
            if better {
                record.best = Some(metrics.clone());
            }
            record.last = Some(metrics);
            let iteration = record.iterations;
            let decision = self
                .scheduler
                .on_result(trial, iteration, mode.score(value));
            let done = self.config.stop_iterations.is_some_and(|n| iteration >= n);
            match decision {
                Decision::Continue => {}
                Decision::Stop => {
                    if !done && !stop {
                        record.stopped_early = !at_max_t(&self.config, iteration);
                    }
                    stop = true;
                }
                Decision::Exploit { from, config } => {
                    stop |= !done && self.exploit(trial, iteration, from, config)?;
                }
            }
            stop |= done;
        }
        Ok(stop || self.budget_over.is_some())
    }

    /// PBT's exploit (`schedule/pbt.rs`): trial `trial` goes on from a copy
    /// of trial `from`'s newest checkpoint with `config`, once its run
    /// stops; `false` (it goes on as it is) when `from` has no checkpoint.
    fn exploit(
        &mut self,
        trial: u64,
        iteration: u64,
        from: u64,
        config: TrialConfig,
    ) -> Result<bool, TuneError> {
        if self.budget_over.is_some() {
            return Ok(false);
        }
        let Some(source) = self.trials[from as usize].checkpoint.clone() else {
            tracing::info!(
                trial,
                from,
                "no exploit: the better trial has no checkpoint yet"
            );
            return Ok(false);
        };
        let record = &mut self.trials[trial as usize];
        let copied = checkpoint::copy(&source, &record.dir).map_err(|e| TuneError::Exploit {
            trial,
            from,
            detail: e.to_string(),
        })?;
        tracing::info!(
            trial,
            from,
            iteration = copied.iteration,
            "exploit: going on from a better trial's checkpoint"
        );
        record.exploits.push(ExploitRecord {
            iteration,
            from,
            from_iteration: copied.iteration,
            config: config.clone(),
        });
        record.config = config;
        record.checkpoint = Some(copied);
        self.exploiting.insert(trial);
        Ok(true)
    }

    /// Step 5.
    fn ended(&mut self, run: u64, end: Result<TrialEnd, String>) -> Result<(), TuneError> {
        let Some(slot) = self.slot_of(run) else {
            return Ok(());
        };
        let Some(running) = self.slots[slot].running.take() else {
            return Ok(());
        };
        let trial = running.trial;
        self.files.trial_ended(trial);
        let failure = match end {
            Ok(TrialEnd::Returned) => None,
            Ok(TrialEnd::Failed(why)) => Some(why),
            Ok(TrialEnd::Refused(refused)) => return Err(TuneError::Refused(refused)),
            Ok(TrialEnd::BadConfig(why)) => return Err(TuneError::BadConfig(why)),
            Ok(TrialEnd::Panicked(message)) => {
                // Its process ends with the panic.
                self.replace_runner(slot);
                Some(format!("panic: {message}"))
            }
            Err(why) => {
                self.replace_runner(slot);
                Some(why)
            }
        };
        if running.timed_out {
            let timeout = self.config.trial_timeout.unwrap_or_default();
            let mut why =
                format!("trial {trial} ran past its trial_timeout ({timeout:?}) and was stopped");
            if let Some(failure) = failure {
                why = format!("{why}; on its way out: {failure}");
            }
            self.exploiting.remove(&trial);
            self.settle(trial, Some(why), false);
        } else if self.exploiting.remove(&trial) && failure.is_none() {
            // Stopped for its exploit: on again, before new trials.
            self.trials[trial as usize].status = TrialStatus::Pending;
            self.retry.push_front(trial);
        } else if let Some(failure) = failure.clone().filter(|_| running.stop_sent) {
            // It was told to stop and failed on its way out: it ends as
            // stopped (a retry would undo the scheduler's decision).
            self.stopped_with(trial, failure);
        } else {
            self.settle(trial, failure, true);
        }
        self.write_state()
    }

    /// A trial ended, failed (`Some`) or not; `retry`: a failure may be
    /// retried.
    fn settle(&mut self, trial: u64, failure: Option<String>, retry: bool) {
        let max_failures = self.config.max_failures;
        let record = &mut self.trials[trial as usize];
        let Some(why) = failure else {
            record.status = TrialStatus::Terminated;
            self.learn(trial);
            self.to_head.finished(&self.trials[trial as usize], None);
            return;
        };
        record.failures += 1;
        tracing::warn!(trial, failures = record.failures, "trial failed: {why}");
        self.to_head.failed(record, &why);
        if retry && record.failures <= max_failures && self.budget_over.is_none() {
            record.status = TrialStatus::Pending;
            self.retry.push_back(trial);
        } else {
            record.status = TrialStatus::Error;
            record.error = Some(why.clone());
            self.to_head.finished(record, Some(why));
            self.search.on_trial_complete(&record.config, None);
        }
    }

    /// A trial told to stop ended otherwise (failed on its way out, or
    /// killed for not stopping in time): it ends as stopped, noting `why`.
    fn stopped_with(&mut self, trial: u64, why: String) {
        let record = &mut self.trials[trial as usize];
        record.status = TrialStatus::Terminated;
        record.error = Some(why);
        self.learn(trial);
        self.to_head.finished(&self.trials[trial as usize], None);
    }

    /// Tells the searcher the result of trial `trial`, which ended
    /// `Terminated` (as `resume` does for a restored experiment).
    fn learn(&mut self, trial: u64) {
        let record = &self.trials[trial as usize];
        let score = record.last.as_ref().and_then(|l| {
            l.get(&self.config.metric)
                .map(|v| self.config.mode.score(*v))
        });
        self.search.on_trial_complete(&record.config, score);
    }

    /// Kills slot `slot`'s runner and starts another in its place, in the
    /// background (`Event::Replaced`); the slot takes no trial meanwhile.
    fn replace_runner(&mut self, slot: usize) {
        let old = std::mem::replace(&mut self.slots[slot].runner, SlotRunner::Starting);
        let options = SpawnOptions::default().num_cpus(self.config.cpus_per_trial);
        let events = self.events.0.clone();
        tokio::spawn(async move {
            if let SlotRunner::Ready(old) = old {
                if let Err(e) = old.kill().await {
                    tracing::warn!("cannot kill a lost trial runner (tried again at the end): {e}");
                    let _ = events.send(Event::Unkilled(old));
                }
            }
            let spawned = actor::spawn::<TrialRunner>((), options).await;
            let _ = events.send(Event::Replaced(slot, spawned.map_err(|e| e.to_string())));
        });
    }

    /// The next trial timeout, the end of the time budget (or of its
    /// grace), the next write of the state file or progress table.
    fn next_deadline(&self) -> Option<Instant> {
        let timeouts = self.config.trial_timeout.and_then(|timeout| {
            self.slots
                .iter()
                .filter_map(|s| {
                    let running = s.running.as_ref()?;
                    running.kill_at.or(running.started.checked_add(timeout))
                })
                .min()
        });
        let budget = match self.budget_over {
            None => self
                .config
                .time_budget
                .and_then(|b| self.started.checked_add(b)),
            Some(at) => at.checked_add(BUDGET_GRACE),
        };
        let progress = self.config.progress_every.and_then(|every| {
            self.last_progress
                .unwrap_or(self.started)
                .checked_add(every)
        });
        [timeouts, budget, self.state_due(), progress]
            .into_iter()
            .flatten()
            .min()
    }

    /// The progress table on standard error, every `progress_every`.
    fn show_progress(&mut self) {
        let Some(every) = self.config.progress_every else {
            return;
        };
        let now = Instant::now();
        let due = self
            .last_progress
            .unwrap_or(self.started)
            .checked_add(every);
        if due.is_none_or(|due| now < due) {
            return;
        }
        self.last_progress = Some(now);
        eprint!(
            "{}",
            progress_table(&self.trials, &self.config, self.started.elapsed())
        );
    }

    /// Steps 5 (timeouts) and 6 (the budget).
    fn check_time(&mut self) -> Result<(), TuneError> {
        let now = Instant::now();
        if let Some(timeout) = self.config.trial_timeout {
            for slot in 0..self.slots.len() {
                let Some(running) = &mut self.slots[slot].running else {
                    continue;
                };
                let trial = running.trial;
                match running.kill_at {
                    None if running
                        .started
                        .checked_add(timeout)
                        .is_some_and(|end| now >= end) =>
                    {
                        running.kill_at = now.checked_add(TIMEOUT_GRACE);
                        if running.stop_sent {
                            // Stopping already (its scheduler, the budget):
                            // it ends as that stop says, if in time.
                            continue;
                        }
                        // Told to stop first, so that it can free what it holds.
                        running.timed_out = true;
                        running.stop_sent = true;
                        if let SlotRunner::Ready(runner) = &self.slots[slot].runner {
                            if let Err(e) = runner.do_send(StopTrial { trial }) {
                                tracing::warn!(trial, "cannot stop the trial: {e}");
                            }
                        }
                    }
                    Some(at) if now >= at => {
                        let timed_out = running.timed_out;
                        self.slots[slot].running = None;
                        self.files.trial_ended(trial);
                        self.exploiting.remove(&trial);
                        self.replace_runner(slot);
                        let why = format!(
                            "trial {trial} ran past its trial_timeout ({timeout:?}), did not stop within {TIMEOUT_GRACE:?} and was killed"
                        );
                        if timed_out {
                            self.settle(trial, Some(why), false);
                        } else {
                            self.stopped_with(trial, why);
                        }
                        self.write_state()?;
                    }
                    _ => {}
                }
            }
        }
        let budget_end = self
            .config
            .time_budget
            .and_then(|b| self.started.checked_add(b));
        if self.budget_over.is_none() && budget_end.is_some_and(|end| now >= end) {
            self.budget_over = Some(now);
            tracing::info!("the experiment's time budget is spent: stopping its trials");
            for slot in &mut self.slots {
                let (Some(running), SlotRunner::Ready(runner)) = (&mut slot.running, &slot.runner)
                else {
                    continue;
                };
                running.stop_sent = true;
                if let Err(e) = runner.do_send(StopTrial {
                    trial: running.trial,
                }) {
                    tracing::warn!(trial = running.trial, "cannot stop the trial: {e}");
                }
            }
        }
        // Trials that did not stop within the grace (no report since):
        // their runners are killed; they end as stopped.
        let grace_over = self
            .budget_over
            .and_then(|at| at.checked_add(BUDGET_GRACE))
            .is_some_and(|end| now >= end);
        if grace_over {
            for slot in 0..self.slots.len() {
                let Some(running) = self.slots[slot].running.take() else {
                    continue;
                };
                self.files.trial_ended(running.trial);
                // No new trial starts: the runner is not replaced.
                if let SlotRunner::Ready(runner) =
                    std::mem::replace(&mut self.slots[slot].runner, SlotRunner::Gone)
                {
                    self.unkilled.push(runner);
                }
                self.exploiting.remove(&running.trial);
                let why =
                    format!("still running {BUDGET_GRACE:?} after the time_budget ran out: killed");
                self.stopped_with(running.trial, why);
                self.write_state()?;
            }
        }
        Ok(())
    }
}

/// Whether `iteration` is the scheduler's `max_t` or beyond (a stop there
/// is the trial's end, not an early stop).
fn at_max_t(config: &TuneConfig, iteration: u64) -> bool {
    config
        .scheduler
        .max_t()
        .is_some_and(|max_t| iteration >= max_t)
}

/// Runs one trial on `runner` and forwards its results and end (step 3).
async fn follow(
    runner: ActorHandle<TrialRunner>,
    request: RunTrial,
    run: u64,
    events: mpsc::UnboundedSender<Event>,
) {
    let trial = request.trial;
    let started = runner.send_with_deadline(request, POLL_DEADLINE).await;
    if let Err(ended) = reply(&runner, run, started).await {
        let _ = events.send(ended);
        return;
    }
    let mut after = 0;
    loop {
        let poll = PollTrial {
            trial,
            after,
            wait_ms: POLL_WAIT.as_millis() as u64,
        };
        let polled = runner
            .send_with_deadline(poll, POLL_WAIT + POLL_DEADLINE)
            .await;
        let progress: TrialProgress = match reply(&runner, run, polled).await {
            Ok(progress) => progress,
            Err(ended) => {
                let _ = events.send(ended);
                return;
            }
        };
        after += progress.results.len() as u64;
        if !progress.results.is_empty() {
            let (decided, decision) = oneshot::channel();
            if events
                .send(Event::Results(run, progress.results, decided))
                .is_err()
            {
                return;
            }
            match decision.await {
                // Before the poll that lets the trial go on (step 3).
                Ok(true) => {
                    if let Err(e) = runner.do_send(StopTrial { trial }) {
                        tracing::warn!(trial, "cannot stop the trial: {e}");
                    }
                }
                Ok(false) => {}
                Err(_) => return,
            }
        }
        if let Some(end) = progress.end {
            let _ = events.send(Event::Ended(run, Ok(end)));
            return;
        }
    }
}

/// The reply of a call to run `run`'s runner, or the `Ended` event its
/// failure means.
async fn reply<T>(
    runner: &ActorHandle<TrialRunner>,
    run: u64,
    call: Result<Result<T, TrialRefusal>, CallError>,
) -> Result<T, Event> {
    match call {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(refused)) => Err(Event::Ended(run, Ok(TrialEnd::Refused(refused)))),
        Err(e) => Err(Event::Ended(run, Err(lost(runner, e).await))),
    }
}

/// Why a call to `runner` failed: its death's cause as the head records
/// it (waited for up to [`DEATH_WAIT`]), else the call's error.
async fn lost(runner: &ActorHandle<TrialRunner>, error: CallError) -> String {
    let mut after = 0;
    let died = actor::next_death(runner, &mut after);
    match tokio::time::timeout(DEATH_WAIT, died).await {
        Ok(Ok(died)) => format!("its runner died: {}", died.reason),
        _ => format!("its runner was lost: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::tune::schedule::Fifo;
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
