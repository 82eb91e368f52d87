//! The node a worker process runs on, set once when the worker starts, and
//! how a fault kills it (`kill_node` rules of the fault-injection harness).

use std::convert::Infallible;
use std::sync::OnceLock;
use std::time::Duration;

use crate::cluster::FaultRequest;
use crate::host::processes::{may_signal, signal_process, Signal};

use super::context::ProcessContext;

/// How long a `kill_node` fault waits for the head to record it.
const REPORT_WAIT: Duration = Duration::from_secs(5);

/// The node process this worker runs on.
pub struct NodeOfWorker {
    /// Its pid (this process's parent when it started).
    pub pid: libc::pid_t,
    /// Its name.
    pub name: String,
    /// Whether it is the head, which the cluster cannot lose.
    pub is_head: bool,
    /// This process's runtime, to report from threads outside it.
    pub runtime: tokio::runtime::Handle,
}

static NODE_OF_WORKER: OnceLock<NodeOfWorker> = OnceLock::new();

/// Why a `kill_node` fault was not injected.
#[derive(Debug, thiserror::Error)]
pub enum KillNodeRefused {
    /// This process is not a worker: it has no node of its own to kill.
    #[error("not in a worker process")]
    NotAWorker,
    /// The cluster cannot lose its head.
    #[error("this worker's node is the head, which the cluster cannot lose")]
    NodeIsHead,
    /// The node could not be signalled: the worker's sandbox scopes its
    /// signals unless the node runs with `NIMBUS_WORKERS_KILL_NODE` set
    /// (`nimbus chaos run` sets it for plans with `kill_node` faults).
    #[error("cannot signal this worker's node: {0}; start the cluster's nodes with NIMBUS_WORKERS_KILL_NODE=1 (as `nimbus chaos run` does, from the plan's node environment) to let kill_node faults fire")]
    CannotSignal(std::io::Error),
}

impl NodeOfWorker {
    /// Records this worker's node (once, when the worker starts).
    pub fn set(node: NodeOfWorker) {
        let _ = NODE_OF_WORKER.set(node);
    }

    /// This worker's node; `None` outside a worker process.
    pub fn get() -> Option<&'static NodeOfWorker> {
        NODE_OF_WORKER.get()
    }
}

/// Kills the node process this worker runs on, for a fault (`kind` hit
/// `target`, fired by `trigger`): tells the head first (the report would
/// otherwise die with the node), then SIGKILLs the node, whose death takes
/// this process with it (`PR_SET_PDEATHSIG`). Blocks; call it from a
/// thread outside the runtime. `Err` says why it may not: not a worker
/// process, its node is the head, or the node cannot be signalled.
pub fn kill_own_node(
    kind: String,
    target: String,
    trigger: String,
) -> Result<Infallible, KillNodeRefused> {
    let node = NodeOfWorker::get().ok_or(KillNodeRefused::NotAWorker)?;
    if node.is_head {
        return Err(KillNodeRefused::NodeIsHead);
    }
    may_signal(node.pid as u32).map_err(KillNodeRefused::CannotSignal)?;
    if let Some(context) = ProcessContext::current() {
        let report = FaultRequest::ReportFault {
            fault: kind,
            target,
            trigger,
            kills_node: Some(node.name.clone()),
        };
        // The timer is made inside the runtime, which it needs.
        let reported = node
            .runtime
            .block_on(async { tokio::time::timeout(REPORT_WAIT, context.call_head(report)).await });
        if !matches!(reported, Ok(Ok(_))) {
            tracing::warn!("the head did not record the kill_node fault; killing the node anyway");
        }
    }
    // SAFETY: getppid() has no preconditions.
    let parent = unsafe { libc::getppid() };
    if parent == node.pid && node.pid > 1 {
        // The pid is our parent's while getppid() still returns it.
        signal_process(node.pid as u32, Signal::KILL).map_err(KillNodeRefused::CannotSignal)?;
    }
    loop {
        std::thread::park();
    }
}
