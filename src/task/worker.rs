//! `TaskWorker`: the actor, one per worker process, that runs tasks: it
//! fetches the argument, runs the registered function on the actor's own
//! thread (the worker's transport runs on another), and stores the result
//! at its owner, or returns it if small.
//!
//! Several tasks may be in flight to one worker (`pool.rs`). They run one
//! at a time, in the order they arrived: each holds the actor's mailbox
//! until it is done (an atomic response), and its answer goes back at
//! once. A panic of the function is caught and fails only its task; the
//! worker goes on with the next.

use std::time::Duration;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::actor::{ProcessContext, RemoteActor, RemoteMessage};
use crate::cluster::{ObjectId, ObjectLocation, RefHolder};
use crate::object_store::refs::LOCAL_COPY_MAX;
use crate::object_store::{self, ObjectBytes, ObjectRef};

/// How long a task waits for its argument objects.
const ARGUMENT_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs tasks, one at a time, in arrival order, in its worker process.
pub struct TaskWorker;

impl Actor for TaskWorker {
    type Context = Context<Self>;
}

impl RemoteActor for TaskWorker {
    const NAME: &'static str = crate::runtime::TASK_WORKER;
    type Args = ();
    fn from_args(_: ()) -> Self {
        TaskWorker
    }
}

/// A task's argument on the wire.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) enum InputWire {
    /// The value's MessagePack bytes.
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
    /// One object's value.
    Object(ObjectRef<()>),
    /// Several objects' values, as one array.
    Gather(Vec<ObjectRef<()>>),
}

/// Why a task failed in its worker. It travels back to the submitter
/// over the wire, so it is serializable; `get` of the result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum TaskFailure {
    /// The worker process has no nimbus runtime.
    #[error("the worker is not initialised")]
    NotInitialized,
    /// The worker's binary registers no such function.
    #[error("this binary registers no task function {0}")]
    NotRegistered(String),
    /// An object the argument refers to could not be fetched.
    #[error("its argument is unavailable: {0}")]
    Argument(String),
    /// The argument is not the function's argument type.
    #[error("cannot decode the argument: {0}")]
    DecodeArgument(String),
    /// The function returned an error: its text.
    #[error("{0}")]
    Function(String),
    /// The function's result could not be encoded.
    #[error("cannot encode the result: {0}")]
    EncodeResult(String),
    /// The function panicked.
    #[error("it panicked: {0}")]
    Panicked(String),
    /// The result's owner could not be reached.
    #[error("cannot reach the result's owner {owner}: {detail}")]
    Owner {
        /// The owner node.
        owner: String,
        /// Why.
        detail: String,
    },
    /// The result could not be stored at its owner.
    #[error("cannot store its result: {0}")]
    Store(String),
}

/// What a task's worker did with its result.
#[derive(Serialize, Deserialize)]
pub enum TaskOutput {
    /// Stored at its owner.
    Stored,
    /// Small and free of references: here it is, for the submitter to keep
    /// and store.
    Inline(#[serde(with = "serde_bytes")] Vec<u8>),
}

/// Run task function `task` and store its result as object `result` at
/// `owner`, held by `holder` (or return it, if small). Answered with the
/// function's error, if any.
#[derive(Clone, Message, Serialize, Deserialize)]
#[rtype(result = "Result<TaskOutput, TaskFailure>")]
pub struct RunTask {
    pub(crate) task: String,
    pub(crate) input: InputWire,
    pub(crate) result: ObjectId,
    pub(crate) owner: ObjectLocation,
    pub(crate) holder: RefHolder,
}

impl RemoteMessage for RunTask {
    const NAME: &'static str = "nimbus.RunTask";
}

impl Handler<RunTask> for TaskWorker {
    type Result = AtomicResponse<Self, Result<TaskOutput, TaskFailure>>;

    fn handle(&mut self, run: RunTask, _: &mut Context<Self>) -> Self::Result {
        // The next task waits in the mailbox until this one is done.
        AtomicResponse::new(Box::pin(execute(run).into_actor(self)))
    }
}

async fn execute(run: RunTask) -> Result<TaskOutput, TaskFailure> {
    let context = ProcessContext::current().ok_or(TaskFailure::NotInitialized)?;
    let function = super::TaskTable::lookup(&context.registry, &run.task)
        .ok_or_else(|| TaskFailure::NotRegistered(run.task.clone()))?;
    let (argument, from_objects) = resolve(run.input)
        .await
        .map_err(|e| TaskFailure::Argument(e.to_string()))?;
    let output = crate::runtime::catch_panic(|| function(&argument, from_objects))
        .map_err(TaskFailure::Panicked)??;
    // `captured` keeps this process's stakes in the references inside the
    // result until the stored result holds them.
    let (bytes, captured) = output;
    if bytes.len() <= LOCAL_COPY_MAX && captured.refs.is_empty() {
        return Ok(TaskOutput::Inline(bytes));
    }
    let owner = context
        .endpoint
        .connect(run.owner.address, Some(&run.owner.node))
        .await
        .map_err(|e| TaskFailure::Owner {
            owner: run.owner.to_string(),
            detail: e.to_string(),
        })?;
    let stored = object_store::store(
        &owner,
        run.result,
        &bytes,
        run.holder,
        captured.refs.clone(),
    )
    .await
    .map_err(|e| TaskFailure::Store(e.to_string()));
    drop(captured);
    stored.map(|()| TaskOutput::Stored)
}

/// The argument's MessagePack bytes, and whether they came from objects.
async fn resolve(input: InputWire) -> Result<(ObjectBytes, bool), object_store::ObjectStoreError> {
    Ok(match input {
        InputWire::Inline(bytes) => (ObjectBytes::Owned(bytes), false),
        InputWire::Object(object) => (object_store::fetch(&object, ARGUMENT_TIMEOUT).await?, true),
        InputWire::Gather(objects) => {
            let mut bytes = array_header(objects.len());
            let fetches = objects
                .iter()
                .map(|object| object_store::fetch(object, ARGUMENT_TIMEOUT));
            for element in futures::future::try_join_all(fetches).await? {
                bytes.extend_from_slice(&element);
            }
            (ObjectBytes::Owned(bytes), true)
        }
    })
}

/// A MessagePack array header for `len` elements (each object's bytes are
/// one encoded element, so a header and their concatenation is the array).
fn array_header(len: usize) -> Vec<u8> {
    if len < 16 {
        vec![0x90 | len as u8]
    } else if len <= u16::MAX as usize {
        let mut header = vec![0xdc];
        header.extend_from_slice(&(len as u16).to_be_bytes());
        header
    } else {
        let mut header = vec![0xdd];
        header.extend_from_slice(&(len as u32).to_be_bytes());
        header
    }
}

#[cfg(test)]
mod tests {
    use super::array_header;

    #[test]
    fn gathered_elements_decode_as_one_array() {
        for len in [0usize, 3, 15, 16, 70_000] {
            let mut bytes = array_header(len);
            for i in 0..len {
                bytes.extend(rmp_serde::to_vec(&(i as u64)).unwrap());
            }
            let back: Vec<u64> = rmp_serde::from_slice(&bytes).unwrap();
            assert_eq!(back, (0..len as u64).collect::<Vec<_>>());
        }
    }
}
