//! Worker mode: a user program started by a node manager with the
//! `nimbus-worker` argument hosts one actor.
//!
//! The actor runs on an actix system of its own thread; the QUIC endpoint
//! runs on a tokio runtime on the main thread and hands calls to it. A
//! panic anywhere in the process is the actor's death: the panic hook
//! records its message, in-flight calls fail with it, the worker prints it
//! for its node manager (`nimbus-worker-died panic: ...`) and exits, and the
//! node manager reports the death and restarts the actor if allowed.

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
        kill_node: kill_node(boot.node_address == boot.head),
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

/// How this worker kills its node for a `kill_node` fault: it tells the
/// head first (the report would otherwise die with it), then SIGKILLs its
/// parent, the node process, and dies with it (`PR_SET_PDEATHSIG`). A
/// worker of the head refuses: the cluster cannot lose its head.
fn kill_node(on_head: bool) -> crate::actor::KillNode {
    // The node that started this worker; if it is gone, getppid() changes.
    let node = std::os::unix::process::parent_id() as libc::pid_t;
    Box::new(move |reason: &str| {
        if on_head {
            tracing::error!("{reason}: not injected, this worker's node is the head");
            return None;
        }
        let fired = crate::actor::faults::FiredFault::from_death(reason);
        let killing = async move {
            if let (Some(context), Some(fired)) = (ProcessContext::current(), fired) {
                let report = ControlRequest::ReportFault {
                    fault: fired.kind,
                    target: fired.target,
                    trigger: fired.trigger,
                };
                let _ = tokio::time::timeout(REPORT_WAIT, context.call_head(&report)).await;
            }
            // SAFETY: kill() has no memory-safety preconditions; the pid is
            // our parent's while getppid() still returns it.
            if unsafe { libc::getppid() } == node && node > 1 {
                unsafe { libc::kill(node, libc::SIGKILL) };
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
