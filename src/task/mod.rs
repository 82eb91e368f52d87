//! Remote tasks: stateless functions, registered by a stable name, run in
//! worker processes anywhere in the cluster; their results land in the
//! object store.
//!
//! ```no_run
//! use nimbus::task::{self, Input, TaskFn, TaskOptions};
//!
//! const SQUARE: TaskFn<u64, u64> = TaskFn::new("example.square");
//!
//! fn main() -> anyhow::Result<()> {
//!     let registry = nimbus::actor::Registry::new().task(SQUARE, |x: u64| Ok::<_, String>(x * x));
//!     let driver = nimbus::init(registry)?;
//!     actix_rt::System::new().block_on(async {
//!         driver.connect().await?;
//!         let nine = task::submit(SQUARE, Input::value(&3)?, TaskOptions::default()).await?;
//!         // Results are ObjectRefs: pass them to other tasks unread.
//!         let eighty_one = task::submit(SQUARE, Input::object(&nine), TaskOptions::default()).await?;
//!         assert_eq!(nimbus::object_store::get(&eighty_one).await?, 81);
//!         Ok(())
//!     })
//! }
//! ```
//!
//! - **Where tasks run** (`pool.rs`): the submitting process leases
//!   `TaskWorker` actors (one worker process each, holding the task's
//!   resources) and reuses them; a new lease goes to this process's own
//!   node first, then to any node with the resources free; when no node
//!   has them free, up to [`MAX_TASKS_IN_FLIGHT_PER_WORKER`] tasks are
//!   sent to one busy worker, which runs them one at a time in order on its
//!   actor's thread (no hop to another thread) and answers each as it
//!   ends; beyond that the task queues until a lease is returned. A task
//!   asking for resources no node offers fails at submission. Leases idle
//!   for [`IDLE_LEASE`] are returned (the worker is killed).
//! - **Arguments** may be values or `ObjectRef`s (`Input::object`), or
//!   several objects gathered into one array (`Input::gather`); references
//!   are fetched to the executing node before the function runs.
//! - **Results and failures**: the result is stored at the submitter's home
//!   node, which owns it (a result of at most 64 KiB holding no references
//!   comes back inline in the reply: the submitter keeps a copy and queues
//!   it as its own small put, `object_store`'s `refs.rs`); a task that
//!   panics or returns an error makes the result *failed*, and `get`
//!   reports the task's name and message (its worker catches the panic and
//!   lives on, as a Ray worker survives a task's exception). A task lost
//!   with its worker process or node is retried on a new lease up to
//!   `max_retries` times (default 3, as in Ray), each task in flight on
//!   that worker on its own count; errors of the function itself are not
//!   retried.
//! - **Listing** (`records.rs`): each task's latest state is reported to
//!   the head about once a second, for `nimbus list tasks`.

mod policy;
mod pool;
pub mod records;
mod worker;

/// Registers task function `task` (a [`TaskFn`] constant) to run `run`, in
/// every process of the program (no `Registry` to build; `init` collects
/// it).
///
/// ```
/// use nimbus::task::TaskFn;
/// const SQUARE: TaskFn<u64, u64> = TaskFn::new("example.square");
/// nimbus::remote_task!(SQUARE, |n: u64| Ok::<_, String>(n * n));
/// ```
#[macro_export]
macro_rules! remote_task {
    ($task:path, $run:expr $(,)?) => {
        $crate::__inventory::submit! {
            $crate::runtime::Registration(|registry| registry.task($task, $run))
        }
    };
}

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::{de::DeserializeOwned, Serialize};

use crate::actor::{
    ActorHandle, CallError, ProcessContext, Registry, SpawnError, SpawnOptions, Strategy,
};
use crate::cluster::ObjectRequest;
use crate::cluster::{DeathCause, ObjectId, ObjectLocation, CPU, GPU};
use crate::object_store::{self, refs, ObjectRef, ObjectStoreError};
use crate::placement::{InBundle, PlacementError, PlacementGroup};
use crate::runtime::transits::{self, Transits};
use crate::transport::RequestOptions;

pub use pool::{IDLE_LEASE, MAX_TASKS_IN_FLIGHT_PER_WORKER};
pub use worker::{RunTask, TaskFailure, TaskOutput, TaskWorker};

use policy::{Failure, Retries, Verdict};
use worker::InputWire;

/// A task function's type-erased entry point: MessagePack argument in,
/// MessagePack result (and the references inside it) out.
pub(crate) type TaskRun =
    Arc<dyn Fn(&[u8], bool) -> Result<(Vec<u8>, refs::Captured), TaskFailure> + Send + Sync>;

/// The name and signature of a task function: `A` in, `R` out. Declare one
/// as a constant and use it both to register and to submit.
pub struct TaskFn<A, R> {
    name: &'static str,
    signature: PhantomData<fn(A) -> R>,
}

impl<A, R> TaskFn<A, R> {
    /// The function registered as `name` (stable across builds).
    pub const fn new(name: &'static str) -> Self {
        TaskFn {
            name,
            signature: PhantomData,
        }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl<A, R> Clone for TaskFn<A, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A, R> Copy for TaskFn<A, R> {}

impl Registry {
    /// Registers `run` as task function `function`. An `Err` it returns (or
    /// a panic) fails the task; `get` of the result reports it. `run` runs
    /// on its worker's actor thread, one task at a time (the worker's later
    /// tasks wait for it; its transport runs on another thread): it may
    /// compute and block as long as it needs.
    pub fn task<A, R, E>(
        self,
        function: TaskFn<A, R>,
        run: impl Fn(A) -> Result<R, E> + Send + Sync + 'static,
    ) -> Self
    where
        A: DeserializeOwned,
        R: Serialize,
        E: std::fmt::Display,
    {
        let entry: TaskRun = Arc::new(move |bytes: &[u8], from_objects: bool| {
            let decode = || rmp_serde::from_slice::<A>(bytes);
            let input = if from_objects {
                refs::reading_object(decode)
            } else {
                decode()
            }
            .map_err(|e| TaskFailure::DecodeArgument(e.to_string()))?;
            let output = run(input).map_err(|e| TaskFailure::Function(e.to_string()))?;
            let (bytes, captured) = refs::capturing(|| rmp_serde::to_vec_named(&output));
            let bytes = bytes.map_err(|e| TaskFailure::EncodeResult(e.to_string()))?;
            Ok((bytes, captured))
        });
        self.extend(|table: &mut TaskTable| {
            table.0.insert(function.name, entry);
        })
    }
}

/// The task functions a program registered, by name (its table in the
/// [`Registry`]).
#[derive(Clone, Default)]
pub(crate) struct TaskTable(HashMap<&'static str, TaskRun>);

impl TaskTable {
    /// The task function registered as `name` in `registry`.
    pub(crate) fn lookup(registry: &Registry, name: &str) -> Option<TaskRun> {
        registry.table::<TaskTable>()?.0.get(name).cloned()
    }
}

/// Adds the actor that runs tasks to a program's registry (done by
/// `nimbus::init`).
pub(crate) fn with_task_worker(registry: Registry) -> Registry {
    registry
        .actor::<TaskWorker>()
        .message::<TaskWorker, RunTask>()
}

/// A task's argument: a value, or object(s) to fetch first.
pub struct Input<A> {
    wire: InputWire,
    /// The object references serialized into a value
    /// (`crate::runtime::transits`).
    transits: Transits,
    argument: PhantomData<fn() -> A>,
}

impl<A: Serialize> Input<A> {
    /// A value, sent along with the task.
    pub fn value(value: &A) -> Result<Self, TaskError> {
        let (bytes, transits) = transits::encoding(|| rmp_serde::to_vec_named(value));
        let bytes = bytes.map_err(|e| TaskError::Encode(e.to_string()))?;
        Ok(Input {
            wire: InputWire::Inline(bytes),
            transits,
            argument: PhantomData,
        })
    }
}

impl<A> Input<A> {
    /// The value of an object (another task's result, a put), fetched to
    /// the executing node.
    pub fn object(object: &ObjectRef<A>) -> Self {
        Input {
            wire: InputWire::Object(object.erase()),
            transits: Transits::NONE,
            argument: PhantomData,
        }
    }
}

impl<E> Input<Vec<E>> {
    /// The values of several objects, as one `Vec` (a reduce over results).
    pub fn gather(objects: &[ObjectRef<E>]) -> Self {
        Input {
            wire: InputWire::Gather(objects.iter().map(ObjectRef::erase).collect()),
            transits: Transits::NONE,
            argument: PhantomData,
        }
    }
}

/// How to run a task.
///
/// ```
/// use nimbus::task::TaskOptions;
/// let options = TaskOptions::default().num_cpus(0.5).max_retries(5);
/// ```
#[derive(Clone, Debug)]
pub struct TaskOptions {
    spawn: SpawnOptions,
    max_retries: u32,
    max_in_flight: usize,
}

impl Default for TaskOptions {
    fn default() -> Self {
        TaskOptions {
            spawn: SpawnOptions::default(),
            max_retries: 3,
            max_in_flight: MAX_TASKS_IN_FLIGHT_PER_WORKER,
        }
    }
}

impl TaskOptions {
    /// CPUs the task holds while it runs (default 1).
    pub fn num_cpus(mut self, cpus: f64) -> Self {
        self.spawn = self.spawn.num_cpus(cpus);
        self
    }

    /// GPUs the task holds while it runs.
    pub fn num_gpus(mut self, gpus: f64) -> Self {
        self.spawn = self.spawn.num_gpus(gpus);
        self
    }

    /// A custom resource.
    pub fn resource(mut self, name: &str, amount: f64) -> Self {
        self.spawn = self.spawn.resource(name, amount);
        self
    }

    /// Where to run it (default: this process's node first, then any).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.spawn = self.spawn.strategy(strategy);
        self
    }

    /// Runs it in bundle `index` of `group`.
    pub fn in_bundle(
        mut self,
        group: &PlacementGroup,
        index: usize,
    ) -> Result<Self, PlacementError> {
        self.spawn = InBundle::in_bundle(self.spawn, group, index)?;
        Ok(self)
    }

    /// Retries after the loss of its worker process or node (default 3).
    pub fn max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// How many tasks (of this placement) may be sent to one leased worker
    /// before the first of them ends, while no node has room for another
    /// (default [`MAX_TASKS_IN_FLIGHT_PER_WORKER`], 4; 0 counts as 1). The
    /// worker runs them one at a time, in order; more in flight saves
    /// round trips for short tasks, fewer keeps long tasks from waiting
    /// behind each other while a new worker could start.
    pub fn max_tasks_in_flight_per_worker(mut self, tasks: usize) -> Self {
        self.max_in_flight = tasks.max(1);
        self
    }
}

/// A task could not be submitted. (A task that fails after submission
/// fails its result: see [`ObjectStoreError::Unavailable`].)
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// This binary registers no task function of that name.
    #[error("task function {0} is not registered in this binary (Registry::task)")]
    NotRegistered(&'static str),
    /// The argument could not be encoded.
    #[error("cannot encode the task's argument: {0}")]
    Encode(String),
    /// No node could ever run it, or the cluster refused the worker.
    #[error(transparent)]
    Placement(#[from] SpawnError),
    /// The object store could not be reached.
    #[error(transparent)]
    ObjectStore(#[from] ObjectStoreError),
}

/// Submits `function(input)`; returns at once with a reference to its
/// result, readable with `object_store::get` once the task is done.
pub async fn submit<A, R>(
    function: TaskFn<A, R>,
    input: Input<A>,
    options: TaskOptions,
) -> Result<ObjectRef<R>, TaskError> {
    let context = ProcessContext::current().ok_or(TaskError::NotInitialized)?;
    if TaskTable::lookup(&context.registry, function.name).is_none() {
        return Err(TaskError::NotRegistered(function.name));
    }
    let holder = refs::holder().ok_or(TaskError::NotInitialized)?;
    if let Some(delivered) = input.transits.delivered() {
        delivered.await;
    }
    let home = home_location(context).await?;
    pool::check_feasible(context, &options.spawn).await?;
    let result = ObjectRef::<R>::expected(ObjectId::random(), home.clone());
    let run = RunTask {
        task: function.name.to_string(),
        input: input.wire,
        result: result.id(),
        owner: home,
        holder,
    };
    let keep = result.erase();
    if let Some(tracked) = keep.tracked() {
        tracked.producing();
    }
    let tracked = records::Tracked::submitted(context, run.result, &run.task);
    tokio::spawn(async move {
        // `keep` holds the result's reference until the task settles, so it
        // cannot be freed before it exists.
        drive(context, run, options, &keep, tracked).await;
        if let Some(tracked) = keep.tracked() {
            tracked.settle();
        }
    });
    Ok(result)
}

/// Runs a submitted task to its end: retries after system failures, a
/// failed result otherwise. Every task in flight holds this future, so the
/// paths taken only on failure (and the store at a remote owner) are boxed
/// to keep it small: 8 KiB before, 3.3 KiB now, which halved the page
/// faults of a burst of 5,000 submissions.
async fn drive(
    context: &'static ProcessContext,
    run: RunTask,
    options: TaskOptions,
    result: &ObjectRef<()>,
    mut tracked: records::Tracked,
) {
    let mut retries = Retries::new(options.max_retries);
    let outcome = loop {
        let lease = match pool::acquire(context, &options.spawn, options.max_in_flight).await {
            Ok(lease) => lease,
            Err(e) => break Err(format!("no worker for task {}: {e}", run.task)),
        };
        tracked.running(lease.worker().id());
        let failure = match lease.worker().send(run.clone()).await {
            Ok(Ok(TaskOutput::Stored)) => {
                pool::release(lease);
                break Ok(());
            }
            Ok(Ok(TaskOutput::Inline(bytes))) => {
                pool::release(lease);
                // Readable here at once; stored at the owner for others.
                if let Some(tracked) = result.tracked() {
                    tracked.keep_copy(&bytes);
                    tracked.settle();
                }
                let stored = store_inline(context, &run, &bytes).await;
                break stored.map_err(|e| format!("task {}: {e}", run.task));
            }
            Ok(Err(application)) => {
                pool::release(lease);
                Failure::Application(application)
            }
            Err(system) => {
                // A panic ends the worker process: the head's record of its
                // death tells a panic from a loss.
                let death = Box::pin(pool::discard(context, lease)).await;
                match death.as_ref().and_then(DeathCause::panic_message) {
                    Some(panic) => Failure::Panicked(panic.to_string()),
                    None if lost(&system) => Failure::Lost(system),
                    None => Failure::NotLost(system),
                }
            }
        };
        match retries.after(failure) {
            Verdict::Retry(system) => {
                tracing::info!(task = %run.task, "task lost ({system}); retrying");
            }
            Verdict::Fail(reason) => break Err(format!("task {} {reason}", run.task)),
        }
    };
    tracked.ended(outcome.as_ref().err().cloned());
    if let Err(message) = outcome {
        Box::pin(fail(context, &run, message)).await;
    }
}

/// Stores a result that came back inline at its owner.
async fn store_inline(
    context: &ProcessContext,
    run: &RunTask,
    bytes: &[u8],
) -> Result<(), TaskFailure> {
    // This process holds the result (it submitted the task): queued as
    // its own small put, ahead of the release of its reference (`drive`
    // keeps one until this returns).
    if refs::holder().as_ref() == Some(&run.holder)
        && refs::queue_store(&run.owner, run.result, bytes.to_vec())
            .await
            .is_ok()
    {
        return Ok(());
    }
    Box::pin(store_at_owner(context, run, bytes)).await
}

/// Stores a result at its owner over the network (a result this process
/// does not hold, or a queued store that failed).
async fn store_at_owner(
    context: &ProcessContext,
    run: &RunTask,
    bytes: &[u8],
) -> Result<(), TaskFailure> {
    let owner = context
        .endpoint
        .connect(run.owner.address, Some(&run.owner.node))
        .await
        .map_err(|e| TaskFailure::Owner {
            owner: run.owner.to_string(),
            detail: e.to_string(),
        })?;
    object_store::store(&owner, run.result, bytes, run.holder.clone(), Vec::new())
        .await
        .map_err(|e| TaskFailure::Store(e.to_string()))
}

/// Marks a task's result failed at its owner.
async fn fail(context: &ProcessContext, run: &RunTask, message: String) {
    let request = ObjectRequest::FailObject {
        id: run.result,
        holder: run.holder.clone(),
        message,
    };
    let sent = match context
        .endpoint
        .connect(run.owner.address, Some(&run.owner.node))
        .await
    {
        Ok(owner) => crate::client::call(&owner, request, RequestOptions::control())
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = sent {
        tracing::warn!(task = %run.task, "cannot record the task's failure: {e}");
    }
}

/// This process's home node.
async fn home_location(context: &ProcessContext) -> Result<ObjectLocation, TaskError> {
    let home = context
        .endpoint
        .connect(context.home, None)
        .await
        .map_err(|e| ObjectStoreError::Cluster(e.into()))?;
    Ok(ObjectLocation {
        node: home.peer().clone(),
        address: context.home,
    })
}

/// Whether a call failed because the worker process (or its node) is gone,
/// rather than because of the task.
fn lost(error: &CallError) -> bool {
    !matches!(error, CallError::Decode { .. } | CallError::Encode { .. })
}

/// Resources a task asks for, for messages.
fn describe(options: &SpawnOptions) -> String {
    let resources = options.resources();
    format!(
        "{} CPU, {} GPU",
        resources.amount(CPU),
        resources.amount(GPU)
    )
}

/// The worker a lease holds.
type Worker = ActorHandle<TaskWorker>;

/// How long [`pool::acquire`] waits between looks for free resources while
/// a task queues.
const QUEUE_POLL: Duration = Duration::from_millis(500);
