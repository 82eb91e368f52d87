//! Jobs on the wire: what `nimbus job submit` asks for, and the record the
//! head keeps of every job (submitted, or a driver attached with
//! `--address`), as `nimbus job list` shows it. The protocol is in
//! `crate::head`'s `jobs.rs`.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::messages::{ActorId, BinaryId};
use super::{DeathCause, ObjectId, Versions};

/// The longest job id a driver may bring (`NIMBUS_JOB_ID`).
pub const MAX_JOB_ID: usize = 64;

/// Whether `id` can name a job: 1 to [`MAX_JOB_ID`] ASCII letters, digits,
/// `-` or `_` (it becomes part of file names on the nodes).
pub fn valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_JOB_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A job's state, as Ray's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Submitted; its driver is not running yet.
    Pending,
    /// Its driver runs.
    Running,
    /// Its driver exited with code 0.
    Succeeded,
    /// Its driver failed: a non-zero exit, a signal, a failed start, a
    /// lost node, or (attached drivers) silence past the grace period.
    Failed,
    /// Stopped on request (`nimbus job stop`).
    Stopped,
}

impl JobState {
    /// Whether the job is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Stopped
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Stopped => "STOPPED",
        })
    }
}

/// A task's state (`nimbus list tasks`), as Ray's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskState {
    /// Submitted; no worker runs it yet.
    Pending,
    /// A worker runs it (an attempt).
    Running,
    /// Its result is stored.
    Finished,
    /// It failed for good: its result is a failure.
    Failed,
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskState::Pending => "PENDING",
            TaskState::Running => "RUNNING",
            TaskState::Finished => "FINISHED",
            TaskState::Failed => "FAILED",
        })
    }
}

/// A task as its submitter last reported it (`crate::task`'s
/// `records.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The task: the id of its result object.
    pub id: ObjectId,
    /// Its function's registered name.
    pub name: String,
    /// The job that submitted it.
    pub job: String,
    /// Its state.
    pub state: TaskState,
    /// The task worker (an actor) running or that ran its last attempt.
    pub worker: Option<ActorId>,
    /// Attempts started.
    pub attempts: u32,
    /// Why it failed.
    pub error: Option<String>,
    /// When it was submitted, in milliseconds since the Unix epoch.
    pub submitted_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch.
    pub ended_ms: Option<u64>,
}

/// A driver program to run on a node of the cluster (`nimbus job submit`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSubmission {
    /// A name to show, if given.
    pub name: Option<String>,
    /// The program and its arguments. A relative program path with a `/`
    /// is taken in the job's working directory, a bare name on `PATH`.
    pub entrypoint: Vec<String>,
    /// Environment variables for the driver, on top of the node's.
    pub env: Vec<(String, String)>,
    /// The working directory, packed (a tar archive) and uploaded to the
    /// node's binary cache first; `None`: an empty directory.
    pub working_dir: Option<BinaryId>,
    /// The node to run the driver on (the head if `None`).
    pub node: Option<String>,
}

/// What the head knows of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job's id: what its actors, bundles and logs are filed under.
    pub id: String,
    /// Its name, if it was given one.
    pub name: Option<String>,
    /// Submitted with `nimbus job submit` (its driver runs on `node`), or a
    /// driver that attached by itself.
    pub submitted: bool,
    /// The driver's command line.
    pub entrypoint: String,
    /// The node its driver runs on (submitted jobs).
    pub node: Option<String>,
    /// Its state.
    pub state: JobState,
    /// Why it is in that state, for the terminal ones.
    pub message: String,
    /// How its driver process ended (submitted jobs).
    pub exit: Option<DeathCause>,
    /// The driver's process id on its node (submitted jobs).
    pub driver_pid: Option<u32>,
    /// When the head first heard of it, in milliseconds since the Unix
    /// epoch.
    pub start_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch.
    pub end_ms: Option<u64>,
    /// What its driver runs (its release, the libtorch it loaded), once
    /// the driver has said.
    #[serde(default)]
    pub versions: Option<Versions>,
}

impl JobRecord {
    /// The exit status a command that waited for this job should end with:
    /// 0 if it succeeded, the driver's exit code if it exited, 128 plus the
    /// signal if it was killed by one, else 1.
    pub fn exit_status(&self) -> i32 {
        match (&self.state, &self.exit) {
            (JobState::Succeeded, _) => 0,
            (_, Some(DeathCause::Exited { code })) if *code != 0 => *code,
            (_, Some(DeathCause::Killed { signal })) => 128 + signal,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_short_and_safe_in_file_names() {
        assert!(valid_job_id("0badf00d"));
        assert!(valid_job_id("nightly_run-3"));
        for bad in ["", "../x", "a/b", "a b", "é", &"x".repeat(MAX_JOB_ID + 1)] {
            assert!(!valid_job_id(bad), "{bad:?}");
        }
    }
}
