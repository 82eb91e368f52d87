//! Worker processes: the node manager runs each actor in a process of its
//! own, started from the driver's binary in worker mode, and learns of its
//! death by reaping it. The protocol with the worker process (argument,
//! boot message, ready and died lines) is in [`crate::runtime::boot`].
//!
//! Starting one:
//! 1. Run the cached binary with the worker argument; stdin and stdout are
//!    pipes, stderr goes to `state_dir/logs/worker-ACTOR-INCARNATION.err`
//!    (appended to); what the actor prints to stdout, all but the protocol
//!    lines, is appended to `.out`, so nothing it prints is lost, and kept
//!    for the job's driver (`output.rs`; `logs.rs` reads `.err` for it). The
//!    environment loses `NIMBUS_ACTOR_FAULTS` (the rules travel in the boot
//!    message) and, unless the node's packet-fault plan says `workers =
//!    true`, `NIMBUS_PACKET_FAULTS`; `CUDA_VISIBLE_DEVICES` names the
//!    actor's devices only (the node's ids; empty for an actor without
//!    GPUs, which then sees none). The child asks to be SIGKILLed when the node
//!    dies (`PR_SET_PDEATHSIG`), so workers die with their node even when it
//!    is killed outright, and enters its sandbox (`sandbox/`) before it
//!    runs the program.
//! 2. Write the boot message, close stdin, and wait up to `START_TIMEOUT`
//!    (30 s) for the ready line; otherwise kill the process and fail with
//!    its status and the tail of its stderr log.
//! 3. Watch the process until it exits (not until its stdout closes),
//!    reading its died line; once it has exited, read what it printed
//!    before for at most `DRAIN_WAIT` (200 ms). Its death cause is the died
//!    line's, else its exit code or signal.

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::cluster::faults::ACTOR_FAULTS_ENV;
use crate::cluster::{ActorSpec, DeathCause};
use crate::host::files::private_log;
use crate::runtime::boot::{
    parse_died, parse_ready, WorkerBoot, WorkerIdentity, DIED, READY, WORKER_ARG,
};
use crate::transport::{
    unix_now, CertificateHash, Credentials, JoinToken, WorkerScope, WorkerSigner,
};
use crate::wire::{HeadKeys, Incarnation, NodeIdentity, Ticket};

use super::error::{NotServing, WorkerStartError};
use super::sandbox::{Entry, WorkerSandbox};

/// How long a worker may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the lines a worker printed before it exited are read, once it
/// has exited (they are in the pipe already; only a pipe held open by a
/// child of the actor makes the read wait this long).
const DRAIN_WAIT: Duration = Duration::from_millis(200);

/// What a node needs to give each of its workers an identity of its own
/// (`crate::transport`'s `tickets.rs`, step 3): the token, to issue the
/// worker a certificate (the worker gets the certificate, not the token),
/// and the node's signer for the worker's ticket.
pub struct WorkerIdentities {
    token: JoinToken,
    signer: WorkerSigner,
    head_keys: HeadKeys,
}

impl WorkerIdentities {
    /// From the cluster token, this node's certified signer and the head's
    /// public ticket keys.
    pub fn new(token: JoinToken, signer: WorkerSigner, head_keys: HeadKeys) -> Self {
        WorkerIdentities {
            token,
            signer,
            head_keys,
        }
    }

    /// This node's ticket.
    pub(super) fn node_ticket(&self) -> Option<&Ticket> {
        self.signer.ticket()
    }

    /// The key this node signs its workers' tickets with, for the head.
    pub(super) fn signs_workers(&self) -> Vec<u8> {
        self.signer.public_key()
    }

    /// This node's renewed ticket, attached to its workers' tickets from
    /// now on, and the head's public ticket keys, given to its workers.
    pub(super) fn renewed(&mut self, ticket: Ticket, head_keys: HeadKeys) {
        self.signer.set_ticket(ticket);
        self.head_keys = head_keys;
    }

    /// The head's public ticket keys, as this node last heard them.
    pub(super) fn head_keys(&self) -> &HeadKeys {
        &self.head_keys
    }

    /// A new ticket for `worker`, with the certificate it asked with and
    /// its scope, valid as long as this node's (`tickets.rs`, step 7).
    pub(super) fn renew(
        &self,
        worker: &NodeIdentity,
        certificate: CertificateHash,
        scope: WorkerScope,
    ) -> Option<Ticket> {
        self.signer
            .certify_worker(worker, certificate, scope, unix_now())
    }

    /// A new identity for the next incarnation of the worker of `spec`'s
    /// actor, confined to the actor's job and program.
    pub(super) fn issue(&self, spec: &ActorSpec) -> Result<WorkerIdentity, WorkerStartError> {
        let name = NodeIdentity {
            name: spec.actor.worker_name(),
            incarnation: Incarnation::fresh(),
        };
        let credentials = Credentials::for_worker(&self.token, &name.name)?;
        let scope = WorkerScope {
            job: spec.job.clone(),
            binary: spec.binary.hash.clone(),
        };
        let ticket = self
            .signer
            .certify_worker(&name, credentials.certificate_hash(), scope, unix_now())
            .ok_or(WorkerStartError::Uncertified)?;
        Ok(WorkerIdentity {
            name,
            credentials: credentials
                .to_worker()
                .ok_or(WorkerStartError::Uncertified)?,
            ticket,
            head_keys: self.head_keys.clone(),
        })
    }
}

/// A worker that serves its actor.
pub(super) struct LaunchedWorker {
    /// Where it serves.
    pub address: SocketAddr,
    /// Its incarnation (the actor's, for this life).
    pub incarnation: Incarnation,
    /// Its process id.
    pub pid: u32,
    /// Its stderr log.
    pub err_log: std::path::PathBuf,
}

/// A worker's two logs (`logs.rs`).
pub(super) struct WorkerLogs {
    /// What it prints to stdout.
    pub out: std::path::PathBuf,
    /// What it writes to stderr.
    pub err: std::path::PathBuf,
}

/// Starts a worker process and waits until it serves; `on_exit` is called
/// with its incarnation and the reason once the process is gone.
pub(super) async fn launch(
    binary: &Path,
    boot: &WorkerBoot,
    logs: &WorkerLogs,
    gpus: String,
    sandbox: &WorkerSandbox,
    on_line: impl FnMut(&str) + Send + 'static,
    on_exit: impl FnOnce(Incarnation, DeathCause) + Send + 'static,
) -> Result<LaunchedWorker, WorkerStartError> {
    let open_log = |log: &Path| {
        private_log(log).map_err(|source| WorkerStartError::Io {
            action: "create",
            path: log.to_path_buf(),
            source,
        })
    };
    let log_file = open_log(&logs.err)?;
    let mut printed = Printed {
        log: std::io::BufWriter::new(open_log(&logs.out)?),
        forward: Box::new(on_line),
    };
    let boot_bytes = rmp_serde::to_vec_named(boot)?;
    let entry = sandbox
        .entry(binary, &boot.spec.job)
        .map_err(|source| WorkerStartError::Io {
            action: "prepare the sandbox for",
            path: binary.to_path_buf(),
            source,
        })?;
    let action = match entry {
        Some(_) => "start (in its sandbox; --worker-sandbox off starts workers without one)",
        None => "start",
    };
    let mut command = worker_command(binary, boot, log_file, gpus, entry);
    let mut child = command.spawn().map_err(|source| WorkerStartError::Io {
        action,
        path: binary.to_path_buf(),
        source,
    })?;
    let pid = child.id().unwrap_or(0);
    let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        let _ = child.start_kill();
        return Err(WorkerStartError::Io {
            action: "open the pipes of",
            path: binary.to_path_buf(),
            source: std::io::Error::other("the process has no standard input or output"),
        });
    };
    let mut lines = BufReader::new(stdout).lines();
    let ready = match tokio::time::timeout(
        START_TIMEOUT,
        boot_and_wait(stdin, &boot_bytes, &mut lines, &mut printed),
    )
    .await
    {
        Ok(ready) => ready,
        Err(_) => Err(NotServing::Timeout(START_TIMEOUT)),
    };
    let (address, incarnation) = match ready {
        Ok(ready) => ready,
        Err(why) => return Err(not_serving(child, why, &logs.err).await),
    };
    metrics::counter!("nimbus_workers_started_total").increment(1);
    tokio::spawn(async move {
        let cause = watch_exit(child, lines, printed).await;
        metrics::counter!("nimbus_workers_died_total", "cause" => cause.kind()).increment(1);
        on_exit(incarnation, cause);
    });
    Ok(LaunchedWorker {
        address,
        incarnation,
        pid,
        err_log: logs.err.clone(),
    })
}

/// The command that runs `binary` as the worker of `boot`'s actor: worker
/// arguments, pipes for the boot message and the protocol lines, stderr to
/// its log, its GPUs, only the fault plans meant for workers, death with
/// its node, and its sandbox.
fn worker_command(
    binary: &Path,
    boot: &WorkerBoot,
    log: std::fs::File,
    gpus: String,
    sandbox: Option<Entry>,
) -> Command {
    let mut command = Command::new(binary);
    command
        .arg(WORKER_ARG)
        .args([
            "--job",
            &boot.spec.job,
            "--actor",
            &boot.spec.actor.to_string(),
        ])
        .env_remove(ACTOR_FAULTS_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log);
    // A node's packet faults reach its workers only when the plan says so.
    let for_workers = crate::transport::PacketFaults::from_env()
        .ok()
        .flatten()
        .is_some_and(|plan| plan.workers);
    if !for_workers {
        command.env_remove(crate::transport::faults::PACKET_FAULTS_ENV);
    }
    command.env("CUDA_VISIBLE_DEVICES", gpus);
    // Workers die with their node, even when the node is killed outright.
    // SAFETY: prctl and the sandbox's steps are async-signal-safe, as
    // pre_exec requires.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            match &sandbox {
                Some(entry) => entry
                    .enter()
                    .map_err(|(_, errno)| std::io::Error::from_raw_os_error(errno)),
                None => Ok(()),
            }
        });
    }
    command
}

/// Writes the boot message, then reads the worker's lines until it says
/// where it serves.
async fn boot_and_wait(
    mut stdin: ChildStdin,
    boot: &[u8],
    lines: &mut Lines<BufReader<ChildStdout>>,
    printed: &mut Printed,
) -> Result<(SocketAddr, Incarnation), NotServing> {
    stdin.write_all(boot).await?;
    drop(stdin);
    while let Some(line) = lines.next_line().await? {
        match line.strip_prefix(READY) {
            Some(ready) => return parse_ready(ready).ok_or(NotServing::Unreadable(line)),
            None => printed.line(&line),
        }
    }
    Err(NotServing::Exited)
}

/// Where the lines a worker prints to stdout go: its log, and the job's
/// output for its driver (`output.rs`).
struct Printed {
    log: std::io::BufWriter<std::fs::File>,
    forward: Box<dyn FnMut(&str) + Send>,
}

impl Printed {
    /// Appends one line the actor printed (a full disk loses the line, not
    /// the worker), and forwards it.
    fn line(&mut self, line: &str) {
        use std::io::Write;
        let _ = writeln!(self.log, "{line}").and_then(|()| self.log.flush());
        (self.forward)(line);
    }
}

/// Kills a worker that did not come up and says why, with how it ended and
/// the last lines of its stderr log.
async fn not_serving(mut child: Child, why: NotServing, log: &Path) -> WorkerStartError {
    let _ = child.start_kill();
    let status = child
        .wait()
        .await
        .map(|s| describe(s).to_string())
        .unwrap_or_default();
    let log_text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = log_text.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    WorkerStartError::NotServing {
        why,
        status,
        log: log.to_path_buf(),
        tail: tail.join(" | "),
    }
}

/// Waits for a serving worker's process to end; its death cause: the one
/// it printed (a panic, a chaos fault), else its exit code or signal. The
/// process's exit ends the watch, not the end of its stdout: a child
/// process of the actor may hold the pipe open for ever.
async fn watch_exit(
    mut child: Child,
    mut lines: Lines<BufReader<ChildStdout>>,
    mut printed: Printed,
) -> DeathCause {
    let mut cause = None;
    let mut read = |line: String| match line.strip_prefix(DIED) {
        Some(died) => cause = Some(parse_died(died)),
        None => printed.line(&line),
    };
    let status = loop {
        tokio::select! {
            line = lines.next_line() => match line {
                Ok(Some(line)) => read(line),
                _ => break child.wait().await,
            },
            status = child.wait() => {
                // What it printed before exiting is in the pipe already.
                while let Ok(Ok(Some(line))) =
                    tokio::time::timeout(DRAIN_WAIT, lines.next_line()).await
                {
                    read(line);
                }
                break status;
            }
        }
    };
    cause.unwrap_or_else(|| match status {
        Ok(status) => describe(status),
        Err(e) => DeathCause::Failed(format!("cannot wait for the worker process: {e}")),
    })
}

/// How a process ended: its exit code or the signal that killed it.
fn describe(status: ExitStatus) -> DeathCause {
    match (status.code(), status.signal()) {
        (Some(code), _) => DeathCause::Exited { code },
        (None, Some(signal)) => DeathCause::Killed { signal },
        _ => DeathCause::Failed(status.to_string()),
    }
}
