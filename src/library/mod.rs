//! The seam for libraries built on nimbus (`nimbus-train`, `nimbus-data`,
//! `nimbus-serve`; RL to come): what a library needs from the runtime beyond the user API
//! (actors, tasks, objects, placement groups), in one documented place, so
//! that a library is written against it rather than around it.
//! `tests/nimbus/architecture.rs` holds the library crates to it: no runtime,
//! transport or wire internals, no raw control requests.
//!
//! - **Faults and recoveries**, for chaos timelines and the dashboard's
//!   events: [`report_fault`] (a fault the library injected and that did
//!   not kill: published as `FaultInjected`), [`report_recovery`]
//!   (something the cluster cannot see recovered: `Recovered`).
//! - **Ending this worker process** with a cause its node reads: [`die`];
//!   its whole node with it: [`kill_own_node`] (a `kill_node` fault).
//! - **Where the code runs**: [`in_worker`], its [`job`], the cluster's
//!   nodes ([`cluster_status`]), where its job's processes share memory
//!   ([`job_shared_memory`]); the program's
//!   tables of entry points (training loops, trainables) in [`registry`].
//! - **The cluster's events** (long-polled from the head, riding out a
//!   head restart): [`events`], [`last_event`].
//! - **Training runs on the dashboard**: [`RunReporter`] and the
//!   [`RunEvent`]s it sends, stamped with [`now_ms`].
//! - **Metrics**: record with the `metrics` facade (names in
//!   `crate::metrics`); a process that is about to be stopped pushes its
//!   last values with [`push_metrics_now`].
//! - **A user loop on a thread of its own**, watched by its actor (events,
//!   long polls, acknowledgements, a stop): [`LoopProgress`] (`loops.rs`).
//! - **Durable state of its own** (Serve's deployments, a pipeline's
//!   progress), kept by the head across its restarts, per library and job:
//!   [`Records`] (`records.rs`); a library adds no table of its own to
//!   the head.
//! - **Private files** (owner-only modes, durable writes, free space):
//!   [`files`]; a caught panic as a death reason: [`panic_text`]; a
//!   panic of the user's code that fails only one piece of work (a task,
//!   a block), not the worker process: [`catch_panic`].
//!
//! The data these carry are the cluster's types, at their one path:
//! `nimbus::cluster::{DeathCause, ClusterEvent, RunEvent, RunHeader, ...}`,
//! `nimbus::cluster::faults::FiredFault`, digests in
//! `nimbus::host::{sha256_file, sha256_bytes}`.

mod loops;
mod records;

use std::sync::Arc;
use std::time::Duration;

use crate::client::ClientError;
use crate::cluster::faults::FiredFault;
use crate::cluster::{
    ClusterEvent, ClusterStatus, DeathCause, Demand, DirectoryReply, DirectoryRequest,
    FaultRequest, MembershipReply, MembershipRequest,
};
use crate::runtime::{ProcessContext, ProcessRole, Registry};

#[cfg(doc)]
use crate::cluster::RunEvent;

pub use crate::host::files;
pub use crate::runtime::run_reports::{now_ms, RunReporter};
pub use crate::runtime::{catch_panic, kill_own_node, panic_text, KillNodeRefused, LAST_PUSH_WAIT};
pub use crate::transport::FaultPlanError;
pub use loops::{LoopPoll, LoopProgress};
pub use records::Records;

/// A library's request of the runtime could not be carried out.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    /// This process has not joined a cluster (`nimbus::init`, then
    /// `Driver::connect` or `block_on`; a worker joins by itself).
    #[error("this process is not connected to a cluster: call nimbus::init, then connect (Driver::block_on does)")]
    NotConnected,
    /// The head or the node could not be asked.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The head answered with a reply of the wrong kind.
    #[error(transparent)]
    Unexpected(#[from] crate::cluster::UnexpectedReply),
}

fn context() -> Result<&'static ProcessContext, LibraryError> {
    ProcessContext::current().ok_or(LibraryError::NotConnected)
}

/// Tells the head that `fault` fired and did not kill (a straggler, a
/// failed checkpoint write); published as a `FaultInjected` event, which
/// chaos timelines and the dashboard show.
pub async fn report_fault(fault: &FiredFault) -> Result<(), LibraryError> {
    let report = FaultRequest::ReportFault {
        fault: fault.kind.clone(),
        target: fault.target.clone(),
        trigger: fault.trigger.clone(),
        kills_node: None,
    };
    context()?.call_head(report).await?;
    Ok(())
}

/// Tells the head that `target` recovered (`what`, in words: "training
/// restored ...") `took` after its failure; published as a `Recovered`
/// event.
pub async fn report_recovery(
    what: String,
    target: String,
    took: Duration,
) -> Result<(), LibraryError> {
    let report = FaultRequest::ReportRecovery {
        what,
        target,
        took_ms: took.as_millis() as u64,
    };
    context()?.call_head(report).await?;
    Ok(())
}

/// Whether this process is a worker a node started to host an actor.
pub fn in_worker() -> bool {
    ProcessRole::current() == ProcessRole::Worker
}

/// Outside a worker process, [`die`] returns this instead of ending the
/// process.
#[derive(Debug)]
pub struct NotAWorker;

/// Ends this worker process now, of `cause`: prints the died line its node
/// reads as the death's cause (a chaos fault's report, say), then SIGKILLs
/// the process (nothing after it runs: no destructor, no flush but
/// stdout's). Outside a worker process (a library in local mode, in the
/// driver) it ends nothing and returns [`NotAWorker`], for the caller to
/// fail with an error instead.
pub fn die(cause: &DeathCause) -> NotAWorker {
    if !in_worker() {
        return NotAWorker;
    }
    use std::io::Write;
    println!("{}", crate::runtime::boot::died_line(cause));
    let _ = std::io::stdout().flush();
    // SAFETY: plain syscall on this process.
    unsafe {
        libc::raise(libc::SIGKILL);
    }
    // SIGKILL cannot be caught: the process is gone before this runs.
    loop {
        std::thread::park();
    }
}

/// The cluster's nodes as the head knows them (`nimbus status`): a
/// library that places one actor per node (Serve's HTTP ingress) reads
/// the alive ones here.
pub async fn cluster_status() -> Result<ClusterStatus, LibraryError> {
    let request = MembershipRequest::Status;
    match context()?.call_head(request).await? {
        MembershipReply::Status(status) => Ok(status),
        reply => {
            Err(ClientError::from(crate::cluster::UnexpectedReply::new("Status", reply)).into())
        }
    }
}

/// What waits for room (`nimbus status`'s pending demands: spawns,
/// placement groups, tasks): a library holding resources it could give
/// back (Serve's autoscaled replicas, for a training run) reads it here.
pub async fn pending_demands() -> Result<Vec<Demand>, LibraryError> {
    match context()?.call_head(DirectoryRequest::ListDemands).await? {
        DirectoryReply::Demands(demands) => Ok(demands),
        reply => {
            Err(ClientError::from(crate::cluster::UnexpectedReply::new("Demands", reply)).into())
        }
    }
}

/// The job this process belongs to (what it spawns, reports and logs is
/// the job's), once this process is connected.
pub fn job() -> Option<String> {
    ProcessContext::current().map(|context| context.job.clone())
}

/// The directory where this job's processes on this host share memory
/// segments (a collective's): `/dev/shm/nimbus-objects-UID/jobs/job-JOB`,
/// made (`0700`) when missing; the only one of the job's in `/dev/shm` its
/// sandboxed workers see, and no other job's workers see it
/// (`crate::host::shared_memory`). Plain `/dev/shm` (the temporary
/// directory without one) for a process with no job yet, or where it
/// cannot be made (said in the log).
pub fn job_shared_memory() -> std::path::PathBuf {
    let shm = std::path::Path::new(crate::host::shared_memory::SHM);
    if !shm.is_dir() {
        return std::env::temp_dir();
    }
    let Some(job) = job() else {
        return shm.to_path_buf();
    };
    crate::host::shared_memory::make_job_segments_dir(shm, &job).unwrap_or_else(|e| {
        tracing::warn!(
            "job {job} shares memory in {} (other jobs' workers may find it): {e}",
            shm.display()
        );
        shm.to_path_buf()
    })
}

/// The program's registry (its actor and message types, and one table per
/// feature: `Registry::table`), once this process is connected.
pub fn registry() -> Option<Arc<Registry>> {
    ProcessContext::current().map(|context| context.registry.clone())
}

/// The cluster's events after number `after`, waiting up to `wait` for
/// one; asked again while the head is unreachable (a watcher rides a head
/// restart out). A `Resync` event says some were missed.
pub async fn events(after: u64, wait: Duration) -> Result<Vec<ClusterEvent>, LibraryError> {
    Ok(context()?.events(after, wait).await?)
}

/// The number of the head's latest event: watch with [`events`] from it.
pub async fn last_event() -> Result<u64, LibraryError> {
    Ok(context()?.last_event().await?)
}

/// Pushes this process's metrics to its node now, for at most
/// [`LAST_PUSH_WAIT`]: what a process about to be stopped calls, so its
/// node keeps the totals of what it did.
pub async fn push_metrics_now() -> Result<(), LibraryError> {
    Ok(context()?.push_metrics_now().await?)
}
