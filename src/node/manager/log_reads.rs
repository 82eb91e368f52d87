//! What the node's workers print: their lines forwarded to drivers,
//! their stderr followed, and their logs and the node's own read back
//! and rotated.

use std::path::PathBuf;

use actix::prelude::*;
use tracing::{info, warn};

use crate::cluster::{ActorId, LogChunk, WorkerReply};
use crate::wire::RemoteError;

use super::NodeManager;
use crate::node::authorize::Confinement;
use crate::node::logs;
use crate::node::logs::Stream;

/// A worker printed a line to its stdout.
#[derive(Message)]
#[rtype(result = "()")]
pub(super) struct WorkerPrinted {
    pub(super) job: String,
    pub(super) actor: ActorId,
    pub(super) name: Option<String>,
    pub(super) line: String,
}

impl Handler<WorkerPrinted> for NodeManager {
    type Result = ();

    fn handle(&mut self, msg: WorkerPrinted, _: &mut Self::Context) {
        self.output.push(&msg.job, msg.actor, msg.name, &msg.line);
    }
}

/// What workers wrote to stderr: per worker, its log, how far it is read
/// now, and the new lines.
#[derive(Message)]
#[rtype(result = "()")]
struct StderrRead(Vec<(ActorId, PathBuf, u64, Vec<String>)>);

impl Handler<StderrRead> for NodeManager {
    type Result = ();

    fn handle(&mut self, StderrRead(read): StderrRead, _: &mut Self::Context) {
        for (actor, path, to, lines) in read {
            // The same incarnation's log still (not restarted meanwhile).
            let Some(worker) = self.workers.get_mut(&actor).filter(|w| w.err_log.0 == path) else {
                continue;
            };
            worker.err_log.1 = to;
            let (job, name) = (worker.spec.job.clone(), worker.spec.name.clone());
            for line in lines {
                self.output.push(&job, actor, name.clone(), &line);
            }
        }
    }
}

/// The lines workers of a job printed here after a number.
#[derive(Message)]
#[rtype(result = "WorkerReply")]
pub struct ReadOutput {
    /// The job.
    pub job: String,
    /// The last line number read.
    pub after: u64,
    /// At most this many.
    pub max: u32,
}

impl Handler<ReadOutput> for NodeManager {
    type Result = MessageResult<ReadOutput>;

    fn handle(&mut self, msg: ReadOutput, _: &mut Self::Context) -> Self::Result {
        let (lines, dropped) = self.output.since(&msg.job, msg.after, msg.max as usize);
        MessageResult(WorkerReply::Output { lines, dropped })
    }
}

/// Read part of the log of an actor's newest worker here.
#[derive(Message)]
#[rtype(result = "Result<LogChunk, RemoteError>")]
pub struct ReadLog {
    /// The actor.
    pub actor: ActorId,
    /// Asked by a worker: only its job's actors that run here.
    pub confined: Option<Confinement>,
    /// Its stderr log rather than its stdout's.
    pub stderr: bool,
    /// From where.
    pub offset: u64,
    /// At most this many bytes.
    pub max: u64,
}

impl Handler<ReadLog> for NodeManager {
    type Result = ResponseFuture<Result<LogChunk, RemoteError>>;

    /// The directory is searched and the file read on the blocking pool.
    fn handle(&mut self, msg: ReadLog, _: &mut Self::Context) -> Self::Result {
        if let Some(confined) = &msg.confined {
            let job = self.workers.get(&msg.actor).map(|w| w.spec.job.as_str());
            let rule = "a worker reads the logs of its own job's running actors only";
            if let Err(e) = confined.allows("ReadLog", job, rule) {
                return Box::pin(futures::future::ready(Err(e.into())));
            }
        }
        let dir = self.config.state_dir.join("logs");
        let node = self.config.identity.name.clone();
        let stream = match msg.stderr {
            true => Stream::Err,
            false => Stream::Out,
        };
        let find = move || {
            logs::newest(&dir, msg.actor, stream)
                .ok_or_else(|| format!("no worker of actor {} ran on node {node}", msg.actor))
        };
        Box::pin(logs::read_chunk(find, msg.offset, msg.max))
    }
}

/// Read part of this node's own log.
#[derive(Message)]
#[rtype(result = "Result<LogChunk, RemoteError>")]
pub struct ReadNodeLog {
    /// From where.
    pub offset: u64,
    /// At most this many bytes.
    pub max: u64,
}

impl Handler<ReadNodeLog> for NodeManager {
    type Result = ResponseFuture<Result<LogChunk, RemoteError>>;

    /// The log is where this process's stderr goes (`nimbus start` sends
    /// it to a file); read on the blocking pool.
    fn handle(&mut self, msg: ReadNodeLog, _: &mut Self::Context) -> Self::Result {
        let node = self.config.identity.name.clone();
        let find = move || {
            let path = std::fs::read_link("/proc/self/fd/2")
                .map_err(|e| format!("node {node} cannot tell where its log goes: {e}"))?;
            match path.is_file() {
                true => Ok(path),
                false => Err(format!(
                    "node {node} writes its log to {}, not to a file (started in a terminal with --block?)",
                    path.display()
                )),
            }
        };
        Box::pin(logs::read_chunk(find, msg.offset, msg.max))
    }
}

impl NodeManager {
    /// Rotates the logs of the workers running here that grew past the
    /// limit (`logs.rs`, step 1), on the blocking pool.
    pub(super) fn rotate_logs(&self) {
        let dir = self.config.state_dir.join("logs");
        let max = self.config.log_max;
        let actors: Vec<ActorId> = self.workers.keys().copied().collect();
        tokio::task::spawn_blocking(move || {
            for actor in actors {
                for stream in [Stream::Out, Stream::Err] {
                    let Some(log) = logs::newest(&dir, actor, stream) else {
                        continue;
                    };
                    match logs::rotate_if_larger(&log, max) {
                        Ok(true) => info!(%actor, log = %log.display(), "worker log rotated"),
                        Ok(false) => {}
                        Err(e) => warn!(%actor, "cannot rotate {}: {e}", log.display()),
                    }
                }
            }
        });
    }

    /// Reads what the workers running here wrote to stderr since last
    /// time (`logs.rs`), on the blocking pool; the lines come back as
    /// `StderrRead`, for the workers' drivers.
    pub(super) fn read_stderr(&mut self, ctx: &mut Context<Self>) {
        let logs: Vec<(ActorId, PathBuf, u64)> = self
            .workers
            .iter()
            .map(|(actor, w)| (*actor, w.err_log.0.clone(), w.err_log.1))
            .collect();
        if logs.is_empty() {
            return;
        }
        let me = ctx.address();
        tokio::task::spawn_blocking(move || {
            let read = logs
                .into_iter()
                .filter_map(|(actor, path, offset)| {
                    let (to, lines) = logs::new_lines(&path, offset).ok()?;
                    (to != offset).then_some((actor, path, to, lines))
                })
                .collect();
            me.do_send(StderrRead(read));
        });
    }
}
