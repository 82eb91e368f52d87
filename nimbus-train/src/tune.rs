//! Whole training runs as Tune trials: with [`TrainerTrainable`], each trial
//! of a `nimbus::tune::Tuner` is a [`Trainer`] run with its own placement
//! group, workers and collective, as Ray Tune runs a `TorchTrainer` per
//! trial.
//!
//! ```text
//! Registry::new().train_loop::<MyLoop>().trainable::<TrainerTrainable<MyLoop>>()
//! Tuner::<TrainerTrainable<MyLoop>>::new(space, TuneConfig::new(..).cpus_per_trial(0.0), ..)
//! ```
//!
//! The trial's runner only coordinates (give it no CPU: `cpus_per_trial(0.0)`);
//! the run's workers hold the resources [`TunedLoop::scaling`] asks for,
//! and a trial waits for them up to the run's `placement_timeout`.
//!
//! Protocol, for one trial (on its `TrialRunner`'s thread, in a worker
//! process):
//! 1. The trial's config decodes as the loop's `Config`; the run's workers
//!    are [`TunedLoop::scaling`]'s, its settings [`TunedLoop::run_config`]'s
//!    (by default stored in `<trial>/run-<k>/train`, a directory of its own
//!    for each run of the trial: no run finds another's checkpoints as its
//!    own).
//! 2. A trial that resumes (a retry, a restored experiment, a PBT exploit)
//!    has a tune checkpoint naming a training checkpoint
//!    ([`TrainCheckpointRef`]): the run starts from it; one that is gone
//!    (the other run's retention removed it) fails the trial, naming it.
//! 3. The [`Trainer`] runs on a thread of its own (its own actix system;
//!    it spawns its workers through the process's link to the cluster, as
//!    any driver). Rank 0's reports come to the trial's thread and go to
//!    the tuner (`TrialContext::report`, which returns once the scheduler
//!    decided) in order, each once: a report the run makes again after one
//!    of its own restarts replaces the one held back, one passed on is not
//!    passed again. A report saved with a checkpoint is held back (and the
//!    ones after it) until that checkpoint is complete, then goes with a
//!    tune checkpoint naming it, so a restart goes on right after that
//!    report; when the run ends, what is held goes without.
//! 4. The tuner stops the trial (its scheduler, a stopping criterion, the
//!    time budget): the trainer's [`StopHandle`](crate::StopHandle) stops its workers and
//!    removes its placement group; the trial ends as stopped once `fit`
//!    returned. While no report comes, the thread looks for a stop every
//!    [`STOP_CHECK`].
//! 5. `fit`'s error fails the trial: the tuner retries it from its newest
//!    tune checkpoint while it has failures left (`max_failures`).
//!
//! Unlike a function trainable's, the run does not wait for the
//! scheduler's decision on each report: its workers go on training while
//! the decision is made, so a stopped trial may have trained a few more
//! steps than it reported. A trial past its `trial_timeout` is stopped
//! the same way; only one that has not ended `TIMEOUT_GRACE` later (its
//! run still launching, or its stop stuck) has its runner killed, and
//! its run's workers, spawned from the runner's process, die with it.

use std::collections::{HashMap, VecDeque};
use std::error::Error;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use nimbus::tune::{Trainable, TrialContext, TrialStopped};

use crate::{Metrics, RunConfig, ScalingConfig, TrainEvent, TrainLoop, TrainResult, Trainer};

/// How often a trial waiting for its run's next report looks for a stop.
pub const STOP_CHECK: Duration = Duration::from_millis(200);

/// A training loop tuned as whole runs (step 1).
pub trait TunedLoop: TrainLoop {
    /// The workers of the run of a trial with `config`.
    fn scaling(config: &Self::Config) -> ScalingConfig;

    /// The run's settings; by default named `train`, stored in `dir`
    /// (`<trial>/run-<k>` for the trial's run k: its first, then one more
    /// per retry, exploit or restore), with the defaults of
    /// [`RunConfig::new`].
    fn run_config(_config: &Self::Config, dir: &Path) -> RunConfig {
        RunConfig::new("train", dir)
    }
}

/// The trainable whose trials are [`Trainer`] runs of loop `L`; register
/// it (`.trainable::<TrainerTrainable<L>>()`) next to `.train_loop::<L>()`.
pub struct TrainerTrainable<L>(PhantomData<L>);

/// What a trial's tune checkpoint holds: the training checkpoint saved
/// with the report it went with (step 2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainCheckpointRef {
    /// The training checkpoint's directory.
    pub path: PathBuf,
    /// The report index it was saved with.
    pub index: u64,
}

/// Why a trainer trial failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainerTrialError {
    /// The training checkpoint the trial resumes from is gone.
    #[error("the training checkpoint {} this trial resumes from is gone (removed by its run's checkpoint retention? keep more: CheckpointConfig::num_to_keep)", path.display())]
    CheckpointGone {
        /// Its directory.
        path: PathBuf,
    },
    /// The run's thread could not start, or ended without a result.
    #[error("the training run's thread {0}")]
    Thread(String),
}

/// What the run's thread tells the trial's thread.
enum News {
    Reported(u64, Metrics, bool),
    Saved(u64, PathBuf),
    Done(Box<TrainResult>),
}

impl<L> Trainable for TrainerTrainable<L>
where
    L: TunedLoop,
{
    const NAME: &'static str = L::NAME;
    type Config = L::Config;

    fn run(config: L::Config, ctx: &mut TrialContext) -> Result<(), Box<dyn Error + Send + Sync>> {
        let scaling = L::scaling(&config);
        let run_dir = (0..)
            .map(|k| ctx.trial_dir().join(format!("run-{k}")))
            .find(|dir| !dir.exists())
            .expect("a free run directory name");
        std::fs::create_dir_all(&run_dir)?;
        let run = L::run_config(&config, &run_dir);
        let resume = ctx.restore::<TrainCheckpointRef>()?;
        if let Some(from) = &resume {
            if !from.path.is_dir() {
                return Err(TrainerTrialError::CheckpointGone {
                    path: from.path.clone(),
                }
                .into());
            }
        }
        let (news, inbox) = mpsc::channel();
        let (handle_to, handle) = mpsc::sync_channel(1);
        let resume_path = resume.as_ref().map(|r| r.path.clone());
        let thread = std::thread::Builder::new()
            .name(format!("trial-{}-trainer", ctx.trial_id()))
            .spawn(move || {
                let events = news.clone();
                let mut trainer = Trainer::<L>::new(config, scaling, run).on_event(move |event| {
                    let _ = match event {
                        TrainEvent::Reported {
                            index,
                            metrics,
                            checkpoint,
                        } => events.send(News::Reported(*index, metrics.clone(), *checkpoint)),
                        TrainEvent::CheckpointSaved(saved) => {
                            events.send(News::Saved(saved.index, saved.path.clone()))
                        }
                        _ => Ok(()),
                    };
                });
                if let Some(path) = resume_path {
                    trainer = trainer.resume_from_checkpoint(path);
                }
                let _ = handle_to.send(trainer.stop_handle());
                let result = actix::System::new().block_on(trainer.fit());
                let _ = news.send(News::Done(Box::new(result)));
            })
            .map_err(|e| TrainerTrialError::Thread(format!("cannot start: {e}")))?;
        let stop = handle
            .recv()
            .map_err(|_| TrainerTrialError::Thread("ended before it started".into()))?;
        let mut relay = Relay {
            ctx,
            held: VecDeque::new(),
            saved: HashMap::new(),
            last: resume.map(|r| r.index),
            stopped: false,
        };
        let result = loop {
            match inbox.recv_timeout(STOP_CHECK) {
                Ok(News::Reported(index, metrics, checkpoint)) => {
                    relay.reported(index, metrics, checkpoint)
                }
                Ok(News::Saved(index, path)) => relay.saved(index, path),
                Ok(News::Done(result)) => {
                    relay.flush();
                    break Some(result);
                }
                Err(RecvTimeoutError::Timeout) => {
                    relay.stopped |= relay.ctx.should_stop();
                }
                Err(RecvTimeoutError::Disconnected) => break None,
            }
            if relay.stopped {
                stop.stop();
            }
        };
        let _ = thread.join();
        let result =
            result.ok_or_else(|| TrainerTrialError::Thread("ended without a result".into()))?;
        if relay.stopped {
            return Err(TrialStopped.into());
        }
        match result.error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

/// Step 3: passes rank 0's reports on to the tuner in order, each once, a
/// report saved with a checkpoint once that checkpoint is complete.
struct Relay<'a> {
    ctx: &'a mut TrialContext,
    /// Reports not yet passed on, in order: index, metrics, whether a
    /// checkpoint is being saved with it.
    held: VecDeque<(u64, Metrics, bool)>,
    /// Checkpoints complete, by report index.
    saved: HashMap<u64, PathBuf>,
    /// The index of the last report passed on.
    last: Option<u64>,
    /// The tuner stopped the trial.
    stopped: bool,
}

impl Relay<'_> {
    fn reported(&mut self, index: u64, metrics: Metrics, checkpoint: bool) {
        if self.last.is_some_and(|last| index <= last) {
            return;
        }
        // A report again after one of the run's own restarts: the later
        // attempt's reports replace the held ones from there.
        while self.held.back().is_some_and(|(held, ..)| *held >= index) {
            self.held.pop_back();
        }
        self.held.push_back((index, metrics, checkpoint));
        self.pass_ready();
    }

    fn saved(&mut self, index: u64, path: PathBuf) {
        self.saved.insert(index, path);
        self.pass_ready();
    }

    /// Passes the held reports up to the first whose checkpoint is not
    /// complete yet.
    fn pass_ready(&mut self) {
        while let Some((index, _, checkpoint)) = self.held.front() {
            if *checkpoint && !self.saved.contains_key(index) {
                return;
            }
            let (index, metrics, _) = self.held.pop_front().expect("checked above");
            let path = self.saved.remove(&index);
            self.pass(index, metrics, path);
        }
    }

    /// The run ended: what is held goes without checkpoints.
    fn flush(&mut self) {
        while let Some((index, metrics, _)) = self.held.pop_front() {
            let path = self.saved.remove(&index);
            self.pass(index, metrics, path);
        }
    }

    fn pass(&mut self, index: u64, metrics: Metrics, checkpoint: Option<PathBuf>) {
        self.last = Some(index);
        self.saved.retain(|i, _| *i > index);
        if self.stopped {
            return;
        }
        let passed = match checkpoint {
            Some(path) => {
                let state = TrainCheckpointRef { path, index };
                match self.ctx.report_with_checkpoint(metrics.clone(), &state) {
                    Ok(()) => Ok(()),
                    Err(nimbus::tune::ReportError::Stopped) => Err(TrialStopped),
                    Err(e) => {
                        // The result still counts; a restart goes on from
                        // an earlier checkpoint.
                        tracing::warn!("cannot write the trial's checkpoint: {e}");
                        self.ctx.report(metrics)
                    }
                }
            }
            None => self.ctx.report(metrics),
        };
        if passed.is_err() {
            self.stopped = true;
        }
    }
}
