//! The `TrainerWorker` actor: one per worker process, owning the user's
//! training loop, which runs on a thread of its own so the actor keeps
//! answering the supervisor (progress polls, abort) during a step.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use super::checkpoint::Checkpoint;
use super::collective::{Collective, GroupAbort, SharedMemoryGroup, SoloGroup};
use super::context::{Ranks, TrainContext};
use super::progress::{Progress, ProgressReport};
use super::{LoopFn, TrainError};
use crate::actor::{ProcessContext, RemoteActor, RemoteMessage};

/// The shared-memory segment a group forms through.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// The segment's path (under `/dev/shm`).
    pub path: PathBuf,
    /// Bytes per rank slot: the allreduce bucket size.
    pub capacity: usize,
    /// Deadline of each collective operation, in milliseconds.
    pub timeout_ms: u64,
}

/// What one worker is to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    /// The registered loop's name.
    pub loop_name: String,
    /// The loop's serialized config.
    #[serde(with = "serde_bytes")]
    pub config: Vec<u8>,
    /// Where it sits in the group.
    pub ranks: Ranks,
    /// The group, for more than one worker.
    pub group: Option<GroupSpec>,
    /// The checkpoint to resume from.
    pub resume: Option<PathBuf>,
    /// Where rank 0 writes checkpoints.
    pub run_dir: PathBuf,
    /// Train on this worker's GPU.
    pub use_gpu: bool,
    /// libtorch intra-op threads (the worker's CPUs).
    pub threads: usize,
    /// Which attempt of the run this is (0 first, then one per restart).
    pub attempt: u32,
}

/// Hosts one worker of a training group.
#[derive(Default)]
pub struct TrainerWorker {
    progress: Option<Arc<Progress>>,
    group: Arc<Mutex<Option<GroupAbort>>>,
}

impl Actor for TrainerWorker {
    type Context = Context<Self>;
}

impl RemoteActor for TrainerWorker {
    const NAME: &'static str = "nimbus.train.TrainerWorker";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Self::default()
    }
}

/// Start the loop; fails if it is unknown or already started.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub struct StartTraining(pub Assignment);

impl RemoteMessage for StartTraining {
    const NAME: &'static str = "nimbus.train.StartTraining";
}

impl Handler<StartTraining> for TrainerWorker {
    type Result = Result<(), String>;

    fn handle(
        &mut self,
        StartTraining(assignment): StartTraining,
        _: &mut Context<Self>,
    ) -> Self::Result {
        if self.progress.is_some() {
            return Err("this worker is already training".into());
        }
        let context = ProcessContext::current().ok_or("nimbus is not initialised")?;
        let run = context
            .registry
            .train_loop_fn(&assignment.loop_name)
            .ok_or_else(|| {
                format!(
                    "training loop {:?} is not registered in this binary (Registry::train_loop)",
                    assignment.loop_name
                )
            })?;
        let progress = Arc::new(Progress::default());
        self.progress = Some(progress.clone());
        let group = self.group.clone();
        std::thread::Builder::new()
            .name("nimbus-train-loop".into())
            .spawn(move || run_worker(run, assignment, progress, group))
            .map_err(|e| format!("cannot start the training thread: {e}"))?;
        Ok(())
    }
}

/// Progress after event `after`, waiting up to `wait_ms` for some.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<ProgressReport, String>")]
pub struct PollTraining {
    /// The last event seen.
    pub after: u64,
    /// How long to wait for news, in milliseconds.
    pub wait_ms: u64,
}

impl RemoteMessage for PollTraining {
    const NAME: &'static str = "nimbus.train.PollTraining";
}

impl Handler<PollTraining> for TrainerWorker {
    type Result = ResponseFuture<Result<ProgressReport, String>>;

    fn handle(&mut self, poll: PollTraining, _: &mut Context<Self>) -> Self::Result {
        let progress = self.progress.clone();
        Box::pin(async move {
            let progress = progress.ok_or("this worker has not started training")?;
            Ok(progress
                .poll(poll.after, Duration::from_millis(poll.wait_ms))
                .await)
        })
    }
}

/// Stop the loop: its current collective and its next report fail.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct AbortTraining {
    /// Why, as the loop will report it.
    pub reason: String,
}

impl RemoteMessage for AbortTraining {
    const NAME: &'static str = "nimbus.train.AbortTraining";
}

impl Handler<AbortTraining> for TrainerWorker {
    type Result = ();

    fn handle(&mut self, AbortTraining { reason }: AbortTraining, _: &mut Context<Self>) {
        if let Some(progress) = &self.progress {
            progress.abort(&reason);
        }
        if let Some(group) = &*self.group.lock().unwrap_or_else(|e| e.into_inner()) {
            group.abort(&reason);
        }
    }
}

/// The loop thread of a worker process.
fn run_worker(
    run: LoopFn,
    assignment: Assignment,
    progress: Arc<Progress>,
    group_slot: Arc<Mutex<Option<GroupAbort>>>,
) {
    let outcome = (|| -> Result<(), TrainError> {
        let collective: Box<dyn Collective> = match &assignment.group {
            None => Box::new(SoloGroup),
            Some(spec) => {
                let group = SharedMemoryGroup::join(
                    &spec.path,
                    assignment.ranks.world_rank,
                    assignment.ranks.world_size,
                    spec.capacity,
                    Duration::from_millis(spec.timeout_ms),
                )?;
                let abort = group.abort_handle();
                if let Some(reason) = progress.aborted() {
                    abort.abort(&reason);
                }
                *group_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(abort);
                Box::new(group)
            }
        };
        run_loop(&run, &assignment, collective, progress.clone())
    })();
    progress.finish(outcome.map_err(|e| e.to_string()));
}

/// Runs the loop of `assignment` with `collective`, on the calling thread:
/// in a worker process, or in the driver for a run of 0 workers.
pub(crate) fn run_loop(
    run: &LoopFn,
    assignment: &Assignment,
    collective: Box<dyn Collective>,
    progress: Arc<Progress>,
) -> Result<(), TrainError> {
    tch::set_num_threads(assignment.threads.max(1) as i32);
    let device = if assignment.use_gpu {
        match tch::Device::cuda_if_available() {
            tch::Device::Cpu => {
                return Err(TrainError::Config(
                    "use_gpu is set but libtorch sees no CUDA device in this worker".into(),
                ))
            }
            gpu => gpu,
        }
    } else {
        tch::Device::Cpu
    };
    let checkpoint = assignment
        .resume
        .as_deref()
        .map(Checkpoint::load)
        .transpose()?;
    let mut context = TrainContext::new(
        assignment.ranks,
        device,
        collective,
        checkpoint,
        progress,
        assignment.run_dir.clone(),
        assignment.attempt,
    );
    // In a worker process a panic also ends the process (its panic hook
    // reports it as the actor's death); in local mode this catches it.
    let result =
        std::panic::catch_unwind(AssertUnwindSafe(|| run(&assignment.config, &mut context)));
    // Checkpoints reported before a failure still count: wait for them.
    let written = context.finish();
    match result {
        Ok(Ok(())) => written,
        Ok(Err(e)) => Err(e),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".into());
            Err(TrainError::Loop(format!("panic: {message}")))
        }
    }
}
