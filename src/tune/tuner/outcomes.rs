//! What the loop does with a trial's news (steps 4 and 5 of `mod.rs`):
//! its results, written and given to the scheduler (a PBT exploit among
//! them), and its end, settled as done, retried or failed.

use super::event_loop::Experiment;
use super::follow::at_max_t;
use crate::library::now_ms;
use crate::tune::checkpoint;
use crate::tune::experiment::{ExploitRecord, ResultLine, TrialStatus};
use crate::tune::schedule::Decision;
use crate::tune::search::TrialConfig;
use crate::tune::trial::{TrialEnd, TrialResult};
use crate::tune::TuneError;

impl Experiment {
    /// Step 4: whether the trial stops.
    pub(super) fn results(
        &mut self,
        run: u64,
        results: Vec<TrialResult>,
    ) -> Result<bool, TuneError> {
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
    pub(super) fn exploit(
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
    pub(super) fn ended(
        &mut self,
        run: u64,
        end: Result<TrialEnd, String>,
    ) -> Result<(), TuneError> {
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
    pub(super) fn settle(&mut self, trial: u64, failure: Option<String>, retry: bool) {
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
    pub(super) fn stopped_with(&mut self, trial: u64, why: String) {
        let record = &mut self.trials[trial as usize];
        record.status = TrialStatus::Terminated;
        record.error = Some(why);
        self.learn(trial);
        self.to_head.finished(&self.trials[trial as usize], None);
    }

    /// Tells the searcher the result of trial `trial`, which ended
    /// `Terminated` (as `resume` does for a restored experiment).
    pub(super) fn learn(&mut self, trial: u64) {
        let record = &self.trials[trial as usize];
        let score = record.last.as_ref().and_then(|l| {
            l.get(&self.config.metric)
                .map(|v| self.config.mode.score(*v))
        });
        self.search.on_trial_complete(&record.config, score);
    }
}
