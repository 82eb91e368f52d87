//! Worker mode: a user program started by a node manager with the
//! `nimbus-worker` argument hosts one actor.
//!
//! The actor runs on an actix system of its own thread; the QUIC endpoint
//! runs on a tokio runtime on the main thread and hands calls to it. A
//! panic anywhere in the process is the actor's death: the panic hook
//! records its message, in-flight calls fail with it, the worker prints it
//! for its node manager (`nimbus-worker-died panic: ...`) and exits, and the
//! node manager reports the death and restarts the actor if allowed.

use std::convert::Infallible;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::cluster::ControlRequest;

use crate::actor::{worker_name, ActorHost, HostedActor, HostedFaults, ProcessContext, Registry};
use crate::node::workers::{died_line, ready_line, WorkerBoot};
use crate::transport::{Credentials, Endpoint, JoinToken, TransportConfig};
use crate::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};

/// Runs this process as a worker and exits; never returns.
pub fn run(registry: Registry) -> ! {
    let code = match serve(registry) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nimbus worker: {e}");
            let _ = writeln!(std::io::stdout(), "{}", died_line(&e));
            1
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}

fn serve(registry: Registry) -> Result<i32, String> {
    let mut boot = Vec::new();
    std::io::stdin()
        .read_to_end(&mut boot)
        .map_err(|e| format!("cannot read the boot message: {e}"))?;
    let boot: WorkerBoot =
        rmp_serde::from_slice(&boot).map_err(|e| format!("bad boot message: {e}"))?;
    let token: JoinToken = boot
        .token
        .parse()
        .map_err(|e: crate::transport::CredentialError| e.to_string())?;
    let registry = Arc::new(registry);

    let panic = Arc::new(OnceLock::new());
    let (died_tx, died) = mpsc::unbounded_channel();
    install_panic_hook(panic.clone(), died_tx);

    let (hosted_tx, hosted_rx) = std::sync::mpsc::channel();
    let spec = boot.spec.clone();
    let actor_registry = registry.clone();
    std::thread::Builder::new()
        .name("nimbus-actor".into())
        .spawn(move || {
            let system = actix::System::new();
            let hosted =
                system.block_on(async { actor_registry.create(&spec.type_name, &spec.args) });
            let _ = hosted_tx.send(hosted);
            system.run()
        })
        .map_err(|e| e.to_string())?;
    let hosted = hosted_rx
        .recv_timeout(Duration::from_secs(30))
        .map_err(|_| "the actor was not created within 30 s".to_string())?
        .map_err(|e| format!("cannot create actor {}: {e:?}", boot.spec.type_name))?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(host(boot, token, registry, hosted, panic, died))
}

async fn host(
    boot: WorkerBoot,
    token: JoinToken,
    registry: Arc<Registry>,
    hosted: HostedActor,
    panic: Arc<OnceLock<String>>,
    mut died: mpsc::UnboundedReceiver<String>,
) -> Result<i32, String> {
    let actor = boot.spec.actor;
    let identity = NodeIdentity {
        name: worker_name(actor),
        incarnation: Incarnation::fresh(),
    };
    let credentials = Credentials::issue(&token, &identity.name).map_err(|e| e.to_string())?;
    let socket = Endpoint::bind_socket(SocketAddr::new([0, 0, 0, 0].into(), 0))
        .map_err(|e| e.to_string())?;
    let port = socket.local_addr().map_err(|e| e.to_string())?.port();
    let me = PeerIdentity {
        role: PeerRole::Worker,
        identity: identity.clone(),
    };
    // Packet faults reach a worker only from a node plan with `workers`.
    let transport = TransportConfig {
        packet_faults: crate::transport::PacketFaults::from_env()?.filter(|plan| plan.workers),
        ..TransportConfig::default()
    };
    let endpoint =
        Endpoint::listen(socket, me, &credentials, transport).map_err(|e| e.to_string())?;
    let binary = std::env::current_exe().map_err(|e| e.to_string())?;
    let context = ProcessContext::new(
        endpoint.clone(),
        boot.head,
        boot.node_address,
        registry.clone(),
        boot.spec.job.clone(),
        (binary, boot.spec.binary.clone()),
    );
    ProcessContext::install(context);
    let _ = NODE_OF_WORKER.set(NodeOfWorker {
        pid: std::os::unix::process::parent_id() as libc::pid_t,
        name: boot.node.name.clone(),
        is_head: boot.node_address == boot.head,
        runtime: tokio::runtime::Handle::current(),
    });
    if let Some(context) = ProcessContext::current() {
        context.host_locally(actor, hosted.clone());
    }
    let faults = HostedFaults {
        rules: boot.faults.clone(),
        target: boot
            .spec
            .name
            .clone()
            .unwrap_or_else(|| boot.spec.type_name.clone()),
        kill: Box::new(|reason: &str| {
            println!("{}", died_line(reason));
            let _ = std::io::stdout().flush();
            // SAFETY: kill() on our own pid has no memory-safety preconditions.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }),
        kill_node: kill_node_of_actor(),
    };
    let host = ActorHost::new(
        registry,
        actor,
        boot.spec.type_name.clone(),
        hosted,
        panic,
        faults,
    );
    endpoint.serve(Arc::new(host));
    let address = SocketAddr::new(boot.advertise_ip, port);
    println!("{}", ready_line(address, identity.incarnation));
    let _ = std::io::stdout().flush();

    let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let (code, reason) = tokio::select! {
        Some(reason) = died.recv() => (1, reason),
        _ = terminate.recv() => (0, "stopped by SIGTERM".to_string()),
    };
    println!("{}", died_line(&reason));
    let _ = std::io::stdout().flush();
    endpoint.shutdown().await;
    Ok(code)
}

/// The node process this worker runs on, for `kill_node` faults.
struct NodeOfWorker {
    /// Its pid (this process's parent when it started).
    pid: libc::pid_t,
    /// Its name.
    name: String,
    /// Whether it is the head, which the cluster cannot lose.
    is_head: bool,
    /// This process's runtime, to report from threads outside it.
    runtime: tokio::runtime::Handle,
}

static NODE_OF_WORKER: OnceLock<NodeOfWorker> = OnceLock::new();

/// Kills the node process this worker runs on, for a fault (`kind` hit
/// `target`, fired by `trigger`): tells the head first (the report would
/// otherwise die with the node), then SIGKILLs the node, whose death takes
/// this process with it (`PR_SET_PDEATHSIG`). Blocks; call it from a
/// thread outside the runtime. `Err` says why it may not: not a worker
/// process, or its node is the head.
pub(crate) fn kill_own_node(
    kind: String,
    target: String,
    trigger: String,
) -> Result<Infallible, String> {
    let node = NODE_OF_WORKER.get().ok_or("not in a worker process")?;
    if node.is_head {
        return Err("this worker's node is the head, which the cluster cannot lose".into());
    }
    if let Some(context) = ProcessContext::current() {
        let report = ControlRequest::ReportFault {
            fault: kind,
            target,
            trigger,
            kills_node: Some(node.name.clone()),
        };
        // The timer is made inside the runtime, which it needs.
        let reported = node.runtime.block_on(async {
            tokio::time::timeout(REPORT_WAIT, context.call_head(&report)).await
        });
        if !matches!(reported, Ok(Ok(_))) {
            tracing::warn!("the head did not record the kill_node fault; killing the node anyway");
        }
    }
    // SAFETY: kill() has no memory-safety preconditions; the pid is our
    // parent's while getppid() still returns it.
    if unsafe { libc::getppid() } == node.pid && node.pid > 1 {
        unsafe { libc::kill(node.pid, libc::SIGKILL) };
    }
    loop {
        std::thread::park();
    }
}

/// How this worker's actor kills its node for a `kill_node` actor fault;
/// `None` on the head.
fn kill_node_of_actor() -> crate::actor::KillNode {
    Box::new(|reason: &str| {
        let fired = crate::actor::faults::FiredFault::from_death(reason)?;
        if NODE_OF_WORKER.get().is_none_or(|node| node.is_head) {
            tracing::error!("{reason}: not injected, this worker's node is the head");
            return None;
        }
        let killing = async move {
            let killed = tokio::task::spawn_blocking(move || {
                kill_own_node(fired.kind, fired.target, fired.trigger)
            })
            .await;
            if let Ok(Err(why)) = killed {
                tracing::error!("kill_node not injected: {why}");
            }
            futures::future::pending().await
        };
        Some(killing.boxed())
    })
}

/// How long a `kill_node` fault waits for the head to record it.
const REPORT_WAIT: Duration = Duration::from_secs(5);

/// Records the first panic's message and reports it, after the default
/// hook has printed it to stderr (the worker's log).
fn install_panic_hook(panic: Arc<OnceLock<String>>, died: mpsc::UnboundedSender<String>) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        let reason = format!("panic: {}", panic_text(info.payload()));
        if panic.set(reason.clone()).is_ok() {
            let _ = died.send(reason);
        }
    }));
}

/// The text of a panic's payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into())
}
