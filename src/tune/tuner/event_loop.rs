//! The experiment's loop (steps 2, 3 and 6 of `mod.rs`): its runners,
//! which trial runs where, its deadlines, its state file and progress.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use tokio::sync::mpsc;

use super::follow::follow;
use super::{Event, Running, Slot, SlotRunner, BUDGET_GRACE, STATE_EVERY, TIMEOUT_GRACE};
use crate::actor::{self, ActorHandle, SpawnOptions};
use crate::tune::config::TuneConfig;
use crate::tune::experiment::{ExperimentFiles, TrialRecord, TrialStatus};
use crate::tune::progress::progress_table;
use crate::tune::schedule::Scheduler;
use crate::tune::search::Searcher;
use crate::tune::to_head::TrialReports;
use crate::tune::trial::{RunTrial, StopTrial, TrialRunner};
use crate::tune::TuneError;

/// A running experiment.
pub(super) struct Experiment {
    pub(super) config: TuneConfig,
    pub(super) search: Box<dyn Searcher>,
    pub(super) scheduler: Box<dyn Scheduler>,
    pub(super) files: ExperimentFiles,
    pub(super) trials: Vec<TrialRecord>,
    /// Trials due for another run: failed, or stopped for an exploit.
    pub(super) retry: VecDeque<u64>,
    /// Trials stopped for an exploit, not yet ended.
    pub(super) exploiting: HashSet<u64>,
    /// Never removed from, so that an index names a slot for good.
    pub(super) slots: Vec<Slot>,
    /// Runners whose kill failed: killed again at the end.
    pub(super) unkilled: Vec<ActorHandle<TrialRunner>>,
    /// The runners are stopped (else dropping the experiment stops them).
    pub(super) stopped: bool,
    pub(super) next_run: u64,
    /// A trial's record changed since `experiment_state.json` was written.
    pub(super) dirty: bool,
    /// When it was last written.
    pub(super) last_state_write: Option<Instant>,
    /// When the progress table was last shown.
    pub(super) last_progress: Option<Instant>,
    pub(super) events: (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>),
    /// When the time budget ran out (running trials were told to stop).
    pub(super) budget_over: Option<Instant>,
    pub(super) started: Instant,
    pub(super) trainable: &'static str,
    /// What the head is told of the trials (`to_head.rs`).
    pub(super) to_head: TrialReports,
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
    pub(super) fn new(
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
    pub(super) async fn start_runners(&mut self, wanted: usize) -> Result<(), TuneError> {
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
    pub(super) async fn stop_runners(&mut self) {
        let runners = self.runners();
        let kills = runners.iter().map(|r| r.kill());
        for (runner, killed) in runners.iter().zip(futures::future::join_all(kills).await) {
            if let Err(e) = killed {
                tracing::warn!(runner = %runner.id(), "cannot stop a trial runner: {e}");
            }
        }
        self.stopped = true;
    }

    pub(super) async fn run(&mut self) -> Result<(), TuneError> {
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

    pub(super) fn write_state(&mut self) -> Result<(), TuneError> {
        self.files.write_state(&self.trials)?;
        self.dirty = false;
        self.last_state_write = Some(Instant::now());
        Ok(())
    }

    pub(super) fn slot_of(&self, run: u64) -> Option<usize> {
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

    /// Kills slot `slot`'s runner and starts another in its place, in the
    /// background (`Event::Replaced`); the slot takes no trial meanwhile.
    pub(super) fn replace_runner(&mut self, slot: usize) {
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
