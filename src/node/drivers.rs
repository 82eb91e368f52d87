//! The drivers of submitted jobs on this node (`nimbus job submit`; the
//! job protocol is in `crate::head::jobs`): the [`DriverRunner`]
//! actor starts them, watches them and stops them.
//!
//! 1. `RunDriver { job, submission, head }`: make `state_dir/jobs/JOB/`
//!    (0700) the driver's working directory; with a working-directory
//!    archive (a tar file the submitter uploaded to the binary cache),
//!    unpack it there first, on the blocking pool. Only files, directories
//!    and symbolic links are unpacked, at most [`MAX_ENTRIES`] of them and
//!    `MAX_WORKING_DIR` bytes in all, without setuid, setgid or sticky
//!    bits; an entry that would land outside the directory, or any other
//!    kind (a device, a pipe, a hard or sparse file), refuses the archive.
//!    Then start the program in it: stdin from
//!    `/dev/null`, stdout and stderr appended to
//!    `state_dir/logs/job-JOB.log`, a process group of its own, and SIGKILL
//!    when the node dies (`PR_SET_PDEATHSIG`). Its environment is the
//!    node's without the fault plans, plus the submission's variables,
//!    `NIMBUS_ADDRESS` (the head), `NIMBUS_JOB_ID` and `NIMBUS_TOKEN`: the
//!    token travels in the environment, which only its user can read,
//!    never in arguments. Answer with its pid.
//! 2. When it exits, tell the head (`DriverExited`, with its exit code or
//!    signal; asked again while the head is unreachable, up to its grace,
//!    `--head-grace-s`) and remove
//!    `state_dir/jobs/JOB/`. The log stays.
//! 3. `StopDriver { job }`: SIGTERM to its process group, SIGKILL after
//!    [`STOP_GRACE`] (5 s) if it is still there.
//! 4. `ReadJobLog`: part of a job's log, while it runs and after. Logs are
//!    rotated by size as workers' are (`logs.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use actix::prelude::*;
use tracing::{info, warn};

use crate::client::{self, MAX_WORKING_DIR};
use crate::cluster::faults::ACTOR_FAULTS_ENV;
use crate::cluster::{valid_job_id, DeathCause, JobReply, JobRequest, LogChunk};
use crate::cluster::{BinaryId, JobSubmission};
use crate::host::files::{private_dir, private_log};
use crate::host::processes::{self, Signal};
use crate::transport::{Endpoint, JoinToken, RequestError, RequestOptions};
use crate::wire::{RemoteError, RemoteErrorKind};

use super::binaries::cached;
use super::logs;

/// The most entries a working-directory archive may hold.
const MAX_ENTRIES: usize = 100_000;

/// How long a driver asked to stop has between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// The pause before telling the head again of a driver's exit, after a
/// request that timed out.
const REPORT_RETRY: Duration = Duration::from_secs(1);

/// Why a job's driver could not be started here.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The job id cannot name files.
    #[error("job id {0:?} is malformed")]
    BadId(String),
    /// The job's driver runs here already.
    #[error("job {0}'s driver runs on this node already")]
    Running(String),
    /// The working-directory archive was not uploaded here.
    #[error("the working directory's archive {} is not in this node's binary cache (upload it first)", .0.hash)]
    NoWorkingDir(BinaryId),
    /// A file or directory could not be made or read.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The program could not be started.
    #[error("cannot start {program:?} in {}: {source}", dir.display())]
    Spawn {
        /// The program.
        program: String,
        /// Its working directory.
        dir: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

impl From<DriverError> for RemoteError {
    fn from(e: DriverError) -> Self {
        RemoteError::new(RemoteErrorKind::BadRequest, e.to_string())
    }
}

/// Runs submitted jobs' drivers on this node.
pub struct DriverRunner {
    state_dir: PathBuf,
    token: JoinToken,
    endpoint: Endpoint,
    head: SocketAddr,
    /// The process (group) id of each running driver.
    running: HashMap<String, u32>,
    /// A driver log past this many bytes is rotated (`logs.rs`).
    log_max: u64,
}

impl DriverRunner {
    /// A runner keeping its files under `state_dir` (rotating logs past
    /// `log_max` bytes), handing drivers `token`, and reporting to the head
    /// at `head` through `endpoint`.
    pub fn new(
        state_dir: PathBuf,
        log_max: u64,
        token: JoinToken,
        endpoint: Endpoint,
        head: SocketAddr,
    ) -> Self {
        DriverRunner {
            state_dir,
            token,
            endpoint,
            head,
            running: HashMap::new(),
            log_max,
        }
    }
}

impl Actor for DriverRunner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(logs::ROTATE_EVERY, |runner, _| {
            let max = runner.log_max;
            let logs: Vec<PathBuf> = runner
                .running
                .keys()
                .map(|job| log_path(&runner.state_dir, job))
                .collect();
            tokio::task::spawn_blocking(move || {
                for log in logs {
                    match logs::rotate_if_larger(&log, max) {
                        Ok(true) => info!(log = %log.display(), "job driver log rotated"),
                        Ok(false) => {}
                        Err(e) => warn!("cannot rotate {}: {e}", log.display()),
                    }
                }
            });
        });
    }
}

/// The log of `job`'s driver in `state_dir`.
fn log_path(state_dir: &Path, job: &str) -> PathBuf {
    state_dir.join("logs").join(format!("job-{job}.log"))
}

/// Step 1: start a submitted job's driver.
#[derive(Message)]
#[rtype(result = "Result<JobReply, RemoteError>")]
pub struct RunDriver {
    /// The job.
    pub job: String,
    /// What to run.
    pub submission: JobSubmission,
    /// The head's address, for the driver.
    pub head: SocketAddr,
}

impl Handler<RunDriver> for DriverRunner {
    type Result = ResponseActFuture<Self, Result<JobReply, RemoteError>>;

    fn handle(&mut self, msg: RunDriver, _: &mut Self::Context) -> Self::Result {
        if !valid_job_id(&msg.job) {
            return Box::pin(fut::ready(Err(DriverError::BadId(msg.job).into())));
        }
        if self.running.contains_key(&msg.job) {
            return Box::pin(fut::ready(Err(DriverError::Running(msg.job).into())));
        }
        let dir = self.state_dir.join("jobs").join(&msg.job);
        let archive = match &msg.submission.working_dir {
            Some(id) => match cached(&self.state_dir.join("binaries"), &id.hash) {
                Some(path) => Some(path),
                None => {
                    let missing = DriverError::NoWorkingDir(id.clone());
                    return Box::pin(fut::ready(Err(missing.into())));
                }
            },
            None => None,
        };
        let logs_dir = self.state_dir.join("logs");
        let prepare = {
            let dir = dir.clone();
            tokio::task::spawn_blocking(move || prepare(&dir, &logs_dir, archive.as_deref()))
        };
        Box::pin(prepare.into_actor(self).map(move |prepared, runner, ctx| {
            prepared.map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))??;
            match runner.start(&msg, &dir, ctx) {
                Ok(pid) => Ok(JobReply::DriverStarted { pid }),
                Err(e) => {
                    tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir));
                    Err(e.into())
                }
            }
        }))
    }
}

/// Makes the driver's working directory (unpacking `archive` into it) and
/// the log directory. Blocking.
fn prepare(dir: &Path, logs_dir: &Path, archive: Option<&Path>) -> Result<(), DriverError> {
    private_dir(logs_dir).map_err(io("create", logs_dir))?;
    private_dir(dir).map_err(io("create", dir))?;
    match archive {
        Some(archive) => unpack(archive, dir, (MAX_ENTRIES, MAX_WORKING_DIR as u64)),
        None => Ok(()),
    }
}

/// An I/O error while doing `action` to `path`.
fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DriverError {
    let path = path.to_path_buf();
    move |source| DriverError::Io {
        action,
        path,
        source,
    }
}

/// Unpacks `archive` into `dir`: at most `max_entries` entries and
/// `max_bytes` bytes (step 1).
fn unpack(
    archive: &Path,
    dir: &Path,
    (max_entries, max_bytes): (usize, u64),
) -> Result<(), DriverError> {
    let refused = |detail: String| io("unpack", archive)(std::io::Error::other(detail));
    let file = std::fs::File::open(archive).map_err(io("open", archive))?;
    let mut unpacked = tar::Archive::new(file);
    // Modes keep their `rwx` bits only (no setuid, setgid or sticky).
    unpacked.set_preserve_permissions(false);
    unpacked.set_overwrite(true);
    let mut bytes = 0u64;
    let entries = unpacked.entries().map_err(io("read", archive))?;
    for (index, entry) in entries.enumerate() {
        let mut entry = entry.map_err(io("read", archive))?;
        let name = entry
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        if index == max_entries {
            return Err(refused(format!(
                "more than {max_entries} entries (a working directory holds the driver's code; move data to shared storage)"
            )));
        }
        let kind = entry.header().entry_type();
        use tar::EntryType::{Continuous, Directory, Regular, Symlink};
        if !matches!(kind, Regular | Continuous | Directory | Symlink) {
            return Err(refused(format!(
                "entry {name:?} is a {kind:?}: only files, directories and symbolic links are unpacked"
            )));
        }
        bytes = bytes.saturating_add(entry.size());
        if bytes > max_bytes {
            return Err(refused(format!(
                "more than {max_bytes} bytes unpacked (at entry {name:?})"
            )));
        }
        // `unpack_in` refuses entries outside `dir` (`..`, absolute
        // paths, through links), answering false.
        if !entry.unpack_in(dir).map_err(io("unpack into", dir))? {
            return Err(refused(format!(
                "entry {name:?} would land outside the working directory"
            )));
        }
    }
    Ok(())
}

impl DriverRunner {
    /// Step 1: starts the driver process of `msg` in `dir` and its watcher.
    fn start(
        &mut self,
        msg: &RunDriver,
        dir: &Path,
        ctx: &mut Context<Self>,
    ) -> Result<u32, DriverError> {
        let log = log_path(&self.state_dir, &msg.job);
        let open = || {
            private_log(&log).map_err(|source| DriverError::Io {
                action: "create",
                path: log.clone(),
                source,
            })
        };
        let (stdout, stderr) = (open()?, open()?);
        let entrypoint = &msg.submission.entrypoint;
        let program = entrypoint.first().cloned().unwrap_or_default();
        // A relative path is the working directory's, a bare name is looked
        // up on PATH.
        let resolved = if program.contains('/') && !program.starts_with('/') {
            dir.join(&program)
        } else {
            PathBuf::from(&program)
        };
        let mut command = tokio::process::Command::new(&resolved);
        command
            .args(&entrypoint[1..])
            .current_dir(dir)
            .env_remove(ACTOR_FAULTS_ENV)
            .env_remove(crate::transport::faults::PACKET_FAULTS_ENV)
            .envs(msg.submission.env.iter().map(|(k, v)| (k, v)))
            .env("NIMBUS_ADDRESS", msg.head.to_string())
            .env("NIMBUS_TOKEN", self.token.to_string())
            .env("NIMBUS_JOB_ID", &msg.job)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe, as pre_exec requires.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(|source| DriverError::Spawn {
            program: program.clone(),
            dir: dir.to_path_buf(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        info!(job = %msg.job, pid, %program, "job driver started");
        self.running.insert(msg.job.clone(), pid);
        let job = msg.job.clone();
        let me = ctx.address();
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => DeathCause::Exited { code },
                    (None, Some(signal)) => DeathCause::Killed { signal },
                    _ => DeathCause::Failed(status.to_string()),
                },
                Err(e) => DeathCause::Failed(format!("cannot wait for the driver: {e}")),
            };
            me.do_send(DriverGone { job, exit });
        });
        Ok(pid)
    }
}

/// Step 2: a driver process exited.
#[derive(Message)]
#[rtype(result = "()")]
struct DriverGone {
    job: String,
    exit: DeathCause,
}

impl Handler<DriverGone> for DriverRunner {
    type Result = ();

    fn handle(&mut self, msg: DriverGone, _: &mut Self::Context) {
        self.running.remove(&msg.job);
        info!(job = %msg.job, "job driver {}", msg.exit);
        let dir = self.state_dir.join("jobs").join(&msg.job);
        let (endpoint, head) = (self.endpoint.clone(), self.head);
        tokio::spawn(async move {
            let removed = tokio::fs::remove_dir_all(&dir).await;
            if let Some(e) = removed
                .as_ref()
                .err()
                .filter(|e| e.kind() != std::io::ErrorKind::NotFound)
            {
                warn!(job = %msg.job, "cannot remove {}: {e}", dir.display());
            }
            let request = JobRequest::DriverExited {
                job: msg.job.clone(),
                exit: msg.exit,
            };
            // Asked again on a new connection while the head is away or
            // slow (up to its grace): a restarted head still knows the job.
            // Only the head's refusal is final.
            let end = tokio::time::Instant::now() + client::head_wait();
            loop {
                let ask = |connection: crate::transport::Connection| {
                    let request = request.clone();
                    async move { client::call(&connection, request, RequestOptions::control()).await }
                };
                let told = client::ask_head(&endpoint, head, true, ask).await;
                let e = match told {
                    Ok(_) => break,
                    Err(e @ client::ClientError::Request(RequestError::Remote { .. })) => e,
                    Err(e) if tokio::time::Instant::now() + REPORT_RETRY < end => {
                        warn!(job = %msg.job, "cannot tell the head the job's driver exited yet: {e}");
                        tokio::time::sleep(REPORT_RETRY).await;
                        continue;
                    }
                    Err(e) => e,
                };
                warn!(job = %msg.job, "cannot tell the head the job's driver exited: {e}");
                break;
            }
        });
    }
}

/// Step 3: stop a job's driver.
#[derive(Message)]
#[rtype(result = "Result<JobReply, RemoteError>")]
pub struct StopDriver(pub String);

impl Handler<StopDriver> for DriverRunner {
    type Result = Result<JobReply, RemoteError>;

    fn handle(&mut self, StopDriver(job): StopDriver, ctx: &mut Self::Context) -> Self::Result {
        let Some(&pid) = self.running.get(&job) else {
            return Err(RemoteError::new(
                RemoteErrorKind::BadRequest,
                format!("job {job}'s driver does not run on this node"),
            ));
        };
        info!(%job, pid, "stopping job driver: SIGTERM, SIGKILL after {STOP_GRACE:?}");
        signal_group(pid, Signal::TERM);
        ctx.run_later(STOP_GRACE, move |runner, _| {
            // Still the same driver (a pid is not reused while its watcher
            // has not reaped it, and the watcher removes it first).
            if runner.running.get(&job) == Some(&pid) {
                warn!(%job, pid, "job driver still running after SIGTERM: SIGKILL");
                signal_group(pid, Signal::KILL);
            }
        });
        Ok(JobReply::Ack)
    }
}

/// Sends `signal` to the process group led by `pid`, one this runner
/// started and whose leader its watcher has not reaped yet.
fn signal_group(pid: u32, signal: Signal) {
    if let Err(e) = processes::signal_group(pid, signal) {
        tracing::debug!("cannot signal the driver's process group {pid}: {e}");
    }
}

/// Step 4: part of a job's driver log.
#[derive(Message)]
#[rtype(result = "Result<LogChunk, RemoteError>")]
pub struct ReadJobLog {
    /// The job.
    pub job: String,
    /// From where.
    pub offset: u64,
    /// At most this many bytes.
    pub max: u64,
}

impl Handler<ReadJobLog> for DriverRunner {
    type Result = ResponseFuture<Result<LogChunk, RemoteError>>;

    /// Read on the blocking pool.
    fn handle(&mut self, msg: ReadJobLog, _: &mut Self::Context) -> Self::Result {
        let path = log_path(&self.state_dir, &msg.job);
        let find = move || match valid_job_id(&msg.job) && path.is_file() {
            true => Ok(path),
            false => Err(format!("no driver of job {:?} ran on this node", msg.job)),
        };
        Box::pin(logs::read_chunk(find, msg.offset, msg.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let regular = |&(name, bytes)| (name, bytes, 0o755, tar::EntryType::Regular);
        archive_of(&entries.iter().map(regular).collect::<Vec<_>>())
    }

    /// An archive of entries with the given modes and kinds.
    fn archive_of(entries: &[(&str, &[u8], u32, tar::EntryType)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for &(name, bytes, mode, kind) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(mode);
            header.set_entry_type(kind);
            // `set_path` refuses `..`; a hostile archive writes the bytes.
            let field = &mut header.as_old_mut().name;
            field[..name.len()].copy_from_slice(name.as_bytes());
            header.set_cksum();
            builder.append(&header, bytes).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn a_working_directory_is_unpacked_in_place_and_nothing_outside_it() {
        let root = tempfile::tempdir().unwrap();
        let packed = root.path().join("archive.tar");
        std::fs::write(
            &packed,
            archive(&[("run.sh", b"#!/bin/sh\n"), ("data/x.txt", b"x")]),
        )
        .unwrap();
        let dir = root.path().join("jobs/j1");
        prepare(&dir, &root.path().join("logs"), Some(&packed)).unwrap();
        assert_eq!(std::fs::read(dir.join("data/x.txt")).unwrap(), b"x");
        let mode = std::fs::metadata(dir.join("run.sh")).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o100,
            0o100,
            "kept executable"
        );

        let hostile = root.path().join("hostile.tar");
        std::fs::write(&hostile, archive(&[("../escaped.txt", b"no")])).unwrap();
        let error = prepare(
            &root.path().join("jobs/j2"),
            &root.path().join("logs"),
            Some(&hostile),
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("outside the working directory"),
            "{error}"
        );
        assert!(!root.path().join("jobs/escaped.txt").exists());
    }

    /// A setuid program is unpacked without its setuid bit; a device, a
    /// pipe, a hard link, too many entries or too many bytes refuse the
    /// archive. Before, the bit was kept and nothing was counted.
    #[test]
    fn an_archive_keeps_no_special_bits_and_stays_within_its_caps() {
        use tar::EntryType::{Block, Char, Fifo, Link, Regular};
        let root = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: Vec<u8>| {
            let path = root.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let fresh = |name: &str| {
            let dir = root.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            dir
        };
        let program = write("suid.tar", archive_of(&[("run", b"x", 0o6755, Regular)]));
        let dir = fresh("suid");
        unpack(&program, &dir, (10, 10)).unwrap();
        let mode = std::fs::metadata(dir.join("run")).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
            0o755
        );

        for kind in [Char, Block, Fifo, Link] {
            let special = write("special.tar", archive_of(&[("dev", b"", 0o644, kind)]));
            let error = unpack(&special, &fresh("special"), (10, 10)).unwrap_err();
            assert!(
                error.to_string().contains("only files, directories"),
                "{error}"
            );
        }
        let many = write("many.tar", archive(&[("a", b""), ("b", b""), ("c", b"")]));
        let error = unpack(&many, &fresh("many"), (2, 10)).unwrap_err();
        assert!(error.to_string().contains("more than 2 entries"), "{error}");
        let large = write("large.tar", archive(&[("a", b"123456"), ("b", b"123456")]));
        let error = unpack(&large, &fresh("large"), (10, 10)).unwrap_err();
        assert!(error.to_string().contains("more than 10 bytes"), "{error}");
    }
}
