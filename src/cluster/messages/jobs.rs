//! Jobs' requests (`ControlRequest::Jobs`): drivers' liveness, submitted
//! jobs, tasks' states and training runs' reports to the head (answered
//! by `crate::head`'s `Jobs`); the end of a job and drivers' processes to
//! nodes. The records they carry are in `cluster/jobs.rs`.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::cluster::{DeathCause, JobRecord, JobSubmission, RunRecord, TaskRecord, Versions};

/// The most events one `JobRequest::RunEvents` carries.
pub const MAX_RUN_EVENTS: usize = 1000;

/// The most task states one `JobRequest::TaskStates` carries.
pub const MAX_TASK_STATES: usize = 1000;

/// How often a driver tells the head its job is alive (`JobRequest::DriverAlive`).
pub const DRIVER_BEAT: std::time::Duration = std::time::Duration::from_secs(1);

/// Jobs (`crate::head`'s `jobs.rs`): a job is one driver program run; what
/// it creates is its own, and ends with it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum JobRequest {
    /// To the head, from a driver every second: its job is alive.
    /// Answered with `Ack`.
    DriverAlive {
        /// The job.
        job: String,
        /// The driver's command line (shown by `nimbus job list` for a
        /// driver that attached by itself).
        #[serde(default)]
        entrypoint: String,
        /// What the driver runs: its release and the libtorch it loaded
        /// (shown by `nimbus job list`).
        #[serde(default)]
        versions: Option<Versions>,
    },
    /// To the head, from a driver that attached by itself, as it ends:
    /// its job is over (`SUCCEEDED`, or `FAILED` if it is panicking), so
    /// its actors go at once rather than after the grace period. Answered
    /// with `Ack`.
    DriverDone {
        /// The job.
        job: String,
        /// Whether the driver ends well (not unwinding from a panic).
        ok: bool,
    },
    /// To a node, from the head once a job's driver is gone: kill the job's
    /// actors (not the detached ones) and release its bundles. Answered
    /// with `Ack`.
    EndJob {
        /// The job.
        job: String,
    },
    /// To the head, from a token holder: run a driver program on a node
    /// (`nimbus job submit`). Answered with [`JobReply::Job`] once the
    /// driver runs (or with the reason it could not start).
    SubmitJob(JobSubmission),
    /// To the head, from a token holder: stop a job (its driver gets
    /// SIGTERM, then SIGKILL after the node's grace; its actors are
    /// killed). Answered with [`JobReply::Job`].
    StopJob {
        /// The job.
        job: String,
    },
    /// To the head: every job it knows, live and ended. Answered with
    /// [`JobReply::Jobs`].
    ListJobs,
    /// To the head, from any process that submits tasks, about once a
    /// second: the latest state of its tasks that changed (at most
    /// `MAX_TASK_STATES`). Answered with `Ack`.
    TaskStates(Vec<TaskRecord>),
    /// To the head: the tasks it knows (the last 10,000). Answered with
    /// [`JobReply::Tasks`].
    ListTasks,
    /// To the head, from a training run's supervisor about once a second
    /// and as the run ends: what the run did since its last batch (at most
    /// [`MAX_RUN_EVENTS`]). Answered with `Ack`.
    RunEvents {
        /// The run.
        run: crate::cluster::RunHeader,
        /// Its events, in order.
        events: Vec<crate::cluster::RunEvent>,
    },
    /// To the head: the training runs it knows, without their points.
    /// Answered with [`JobReply::Runs`].
    ListRuns,
    /// To the head: one training run, with its points. Answered with
    /// [`JobReply::Run`].
    GetRun {
        /// The run's id.
        run: String,
    },
    /// To a node, from the head: start a submitted job's driver. Answered
    /// with [`JobReply::DriverStarted`].
    RunDriver {
        /// The job.
        job: String,
        /// What to run.
        submission: JobSubmission,
        /// The head's address, for the driver.
        head: SocketAddr,
    },
    /// To a node, from the head: stop a job's driver (SIGTERM, SIGKILL
    /// after the grace). Answered with `Ack`.
    StopDriver {
        /// The job.
        job: String,
    },
    /// To the head, from the node that ran it: a submitted job's driver
    /// exited. Answered with `Ack`.
    DriverExited {
        /// The job.
        job: String,
        /// How it ended.
        exit: DeathCause,
    },
    /// To a node: up to `max` bytes from `offset` of a submitted job's
    /// driver log there. Answered with [`JobReply::Log`].
    ReadJobLog {
        /// The job.
        job: String,
        /// Where to start reading.
        offset: u64,
        /// The most bytes to return (the node caps it at 1 MiB).
        max: u64,
    },
}

/// What answers a [`JobRequest`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum JobReply {
    /// Done.
    Ack,
    /// A job, as the head knows it.
    Job(Box<JobRecord>),
    /// Every job the head knows.
    Jobs(Vec<JobRecord>),
    /// The tasks the head knows.
    Tasks(Vec<TaskRecord>),
    /// The training runs the head knows (without their points).
    Runs(Vec<RunRecord>),
    /// One training run, if the head knows it.
    Run(Option<Box<RunRecord>>),
    /// A submitted job's driver runs, with this process id.
    DriverStarted {
        /// Its process id on the node.
        pid: u32,
    },
    /// Part of a driver's log.
    Log(super::LogChunk),
}
