//! Worker processes: the node manager runs each actor in a process of its
//! own, started from the driver's binary in worker mode, and learns of its
//! death by reaping it.
//!
//! The protocol with a worker process is three lines and a pipe:
//! 1. the node writes a [`WorkerBoot`] (MessagePack) to the worker's stdin
//!    and closes it (the token never appears in the command line or the
//!    environment);
//! 2. the worker prints `nimbus-worker-ready ADDRESS INCARNATION` once it
//!    serves its actor;
//! 3. before dying of a panic it prints `nimbus-worker-died REASON`.
//!    The node reaps the process and reports the death with that reason, or
//!    with its exit code or signal.

use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::actor::faults::ActorFault;
use crate::cluster::ActorSpec;
use crate::wire::{Incarnation, NodeIdentity};

/// Argument that puts a program in worker mode (and lets `pgrep -f
/// nimbus-worker` find worker processes).
pub const WORKER_ARG: &str = "nimbus-worker";
/// How long a worker may take to start serving.
const START_TIMEOUT: Duration = Duration::from_secs(30);
const READY: &str = "nimbus-worker-ready ";
const DIED: &str = "nimbus-worker-died ";

/// What a worker process reads from stdin when it starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerBoot {
    /// The actor to host.
    pub spec: ActorSpec,
    /// The cluster token.
    pub token: String,
    /// The head's address (for lookups and spawns from inside the actor).
    pub head: SocketAddr,
    /// The node that started it.
    pub node: NodeIdentity,
    /// That node's address (its object store is the worker's home).
    pub node_address: SocketAddr,
    /// The IP to advertise.
    pub advertise_ip: IpAddr,
    /// Fault rules to apply to this incarnation (fault-injection tests).
    pub faults: Vec<ActorFault>,
}

/// A worker that serves its actor.
pub struct LaunchedWorker {
    /// Where it serves.
    pub address: SocketAddr,
    /// Its incarnation (the actor's, for this life).
    pub incarnation: Incarnation,
    /// Its process id.
    pub pid: u32,
}

/// Starts a worker process and waits until it serves; `on_exit` is called
/// with its incarnation and the reason once the process is gone.
pub async fn launch(
    binary: &Path,
    boot: &WorkerBoot,
    log: &Path,
    gpus: Option<String>,
    on_exit: impl FnOnce(Incarnation, String) + Send + 'static,
) -> Result<LaunchedWorker, String> {
    let log_file =
        std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let mut command = Command::new(binary);
    command
        .arg(WORKER_ARG)
        .args([
            "--job",
            &boot.spec.job,
            "--actor",
            &boot.spec.actor.to_string(),
        ])
        .env_remove(crate::actor::faults::ACTOR_FAULTS_ENV)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file);
    // A node's packet faults reach its workers only when the plan says so.
    let for_workers = crate::transport::PacketFaults::from_env()
        .ok()
        .flatten()
        .is_some_and(|plan| plan.workers);
    if !for_workers {
        command.env_remove(crate::transport::faults::PACKET_FAULTS_ENV);
    }
    if let Some(gpus) = gpus {
        command.env("CUDA_VISIBLE_DEVICES", gpus);
    }
    // Workers die with their node, even when the node is killed outright.
    // SAFETY: prctl is async-signal-safe, as pre_exec requires.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let pid = child.id().unwrap_or(0);
    let boot_bytes = rmp_serde::to_vec_named(boot).map_err(|e| e.to_string())?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let started = async {
        stdin
            .write_all(&boot_bytes)
            .await
            .map_err(|e| e.to_string())?;
        drop(stdin);
        while let Some(line) = lines.next_line().await.map_err(|e| e.to_string())? {
            if let Some(ready) = line.strip_prefix(READY) {
                return parse_ready(ready).ok_or_else(|| format!("unreadable line {line:?}"));
            }
        }
        Err("it exited before serving".to_string())
    };
    let ready = match tokio::time::timeout(START_TIMEOUT, started).await {
        Ok(ready) => ready,
        Err(_) => Err(format!("it did not serve within {START_TIMEOUT:?}")),
    };
    let (address, incarnation) = match ready {
        Ok(ready) => ready,
        Err(e) => {
            let _ = child.start_kill();
            let status = child.wait().await.map(describe).unwrap_or_default();
            let log_text = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = log_text.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!(
                "worker process failed to start: {e} ({status}); {} says: {}",
                log.display(),
                tail.join(" | ")
            ));
        }
    };
    tokio::spawn(async move {
        let mut reason = None;
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(died) = line.strip_prefix(DIED) {
                reason = Some(died.to_string());
            }
        }
        let status = child.wait().await;
        on_exit(
            incarnation,
            reason.unwrap_or_else(|| status.map(describe).unwrap_or_else(|e| e.to_string())),
        );
    });
    Ok(LaunchedWorker {
        address,
        incarnation,
        pid,
    })
}

/// The line a worker prints once it serves.
pub fn ready_line(address: SocketAddr, incarnation: Incarnation) -> String {
    format!("{READY}{address} {incarnation}")
}

/// The line a worker prints before it dies of `reason`.
pub fn died_line(reason: &str) -> String {
    format!("{DIED}{}", reason.replace('\n', " "))
}

fn parse_ready(ready: &str) -> Option<(SocketAddr, Incarnation)> {
    let (address, incarnation) = ready.split_once(' ')?;
    Some((
        address.parse().ok()?,
        Incarnation(incarnation.trim().parse().ok()?),
    ))
}

/// "exited with code N" or "killed by signal N".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}
