//! Worker mode: a user program started by a node manager with the
//! `nimbus-worker` argument hosts one actor. This is the composition root
//! of a worker process.
//!
//! 1. Read the boot message from stdin (`crate::runtime::boot`).
//! 2. Build the actor from its constructor arguments on an actix system of
//!    its own thread, within `CREATE_TIMEOUT` (30 s).
//! 3. With glibc told to keep freed memory (`TRIM_THRESHOLD`,
//!    `MMAP_THRESHOLD`), on a single-threaded tokio runtime on the main
//!    thread (its transport is one thread's work: a call crosses no
//!    thread but the actor's, measured faster than two threads for
//!    every call size): open a QUIC endpoint named
//!    `worker-<actor id>` with a fresh incarnation (with the node's packet
//!    plan only if it says `workers = true`), install the process context
//!    (home node: this worker's node), start the object store's reference
//!    queue, report packet-fault counts if a plan is active, record the
//!    node it runs on (for `kill_node` faults), and keep its ticket
//!    renewed with its node half-way through each one's life
//!    (`crate::transport`'s `tickets.rs`, step 7; a refusal is retried
//!    every [`RENEW_RETRY`]).
//! 4. Serve calls through the actor host, then print the ready line.
//! 5. Run until the actor dies or SIGTERM; print the died line with the
//!    cause (`Stopped` for SIGTERM), close the endpoint and exit.
//!
//! A panic anywhere in the process is the actor's death, except a task
//! function's, which fails only its task (`crate::task`): the panic hook
//! records its message, in-flight calls fail with it, the worker prints it
//! for its node manager (`nimbus-worker-died`, `Panicked`) and exits, and
//! the node manager reports the death and restarts the actor if allowed. A
//! worker that cannot host its actor prints `Failed` with the reason.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::actor::{ActorAccess, ActorHost, HostedFaults};
use crate::cluster::faults::FiredFault;
use crate::cluster::{ActorOwner, DeathCause};
use crate::cluster::{WorkerReply, WorkerRequest};
use crate::host::processes::{signal_process, Signal};
use crate::runtime::boot::{died_line, ready_line, WorkerBoot, WorkerIdentity};
use crate::runtime::DispatchError;
use crate::runtime::{
    kill_own_node, panic_text, HostedActor, NodeOfWorker, ProcessContext, Registry, TASK_WORKER,
};
use crate::transport::{
    renewal_due_at, unix_now, CredentialError, Credentials, Endpoint, EndpointError,
    FaultPlanError, TransportConfig,
};
use crate::wire::{PeerIdentity, PeerRole, Ticket};

/// How long a worker waits to ask its node again for a ticket it refused
/// or did not answer (step 3).
const RENEW_RETRY: Duration = Duration::from_secs(1);

/// Step 3: renews `ticket` with this worker's node half-way through its
/// life, presenting each new one from then on.
async fn keep_ticket(context: &'static ProcessContext, mut ticket: Ticket) {
    loop {
        let due = renewal_due_at(&ticket).unwrap_or(0);
        let wait = Duration::from_secs(due.saturating_sub(unix_now())).max(RENEW_RETRY);
        tokio::time::sleep(wait).await;
        match context.call_node(WorkerRequest::RenewTicket).await {
            Ok(WorkerReply::Renewed {
                ticket: renewed,
                head_keys,
            }) => {
                context.endpoint.renew(renewed.clone(), head_keys);
                ticket = renewed;
            }
            Ok(other) => tracing::warn!(
                "this worker's node answered its ticket renewal with {other:?}; asking again"
            ),
            Err(e) => {
                tracing::warn!("this worker's node did not renew its ticket ({e}); asking again")
            }
        }
    }
}

/// How long the actor's constructor may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a worker process could not host its actor.
#[derive(Debug, thiserror::Error)]
enum WorkerError {
    /// Standard input did not deliver the boot message.
    #[error("cannot read the boot message: {0}")]
    ReadBoot(#[source] std::io::Error),
    /// The boot message is not a `WorkerBoot`.
    #[error("bad boot message: {0}")]
    Boot(#[from] rmp_serde::decode::Error),
    /// The token is malformed.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// A thread, the async runtime, a signal handler or the local address
    /// could not be had.
    #[error("cannot {what}: {source}")]
    Os {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The actor's constructor did not finish in time.
    #[error("the actor was not created within {0:?}")]
    CreateTimeout(Duration),
    /// The actor could not be created.
    #[error("cannot create actor {type_name}: {cause:?}")]
    Create {
        /// Its type.
        type_name: String,
        /// Why.
        cause: DispatchError,
    },
    /// The QUIC endpoint could not start.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// `NIMBUS_PACKET_FAULTS` is malformed.
    #[error(transparent)]
    FaultPlan(#[from] FaultPlanError),
}

/// An OS error while doing `what`.
fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> WorkerError {
    move |source| WorkerError::Os { what, source }
}

/// Runs this process as a worker and exits; never returns.
pub(crate) fn run(registry: Registry) -> ! {
    let code = match serve(registry) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nimbus worker: {e}");
            let died = died_line(&DeathCause::Failed(e.to_string()));
            let _ = writeln!(std::io::stdout(), "{died}");
            1
        }
    };
    let _ = std::io::stdout().flush();
    std::process::exit(code)
}

fn serve(registry: Registry) -> Result<i32, WorkerError> {
    let mut boot = Vec::new();
    std::io::stdin()
        .read_to_end(&mut boot)
        .map_err(WorkerError::ReadBoot)?;
    let boot: WorkerBoot = rmp_serde::from_slice(&boot)?;
    boot.remember();
    crate::runtime::logging::set_tags(&[
        ("job", &boot.spec.job),
        ("actor", &boot.spec.actor.to_string()),
        ("node", &boot.node.name),
    ]);
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
        .map_err(os("start the actor's thread"))?;
    let hosted = hosted_rx
        .recv_timeout(CREATE_TIMEOUT)
        .map_err(|_| WorkerError::CreateTimeout(CREATE_TIMEOUT))?
        .map_err(|cause| WorkerError::Create {
            type_name: boot.spec.type_name.clone(),
            cause,
        })?;

    keep_freed_memory();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(os("start the async runtime"))?;
    runtime.block_on(host(boot, registry, hosted, panic, died))
}

/// What glibc's allocator keeps of freed memory at the top of the heap
/// instead of giving it back to the kernel, and the size from which it
/// maps an allocation on its own: both fixed, so that a worker serving
/// large calls (1 MiB in, 1 MiB out) reuses its heap instead of shrinking
/// and regrowing it, and faulting in fresh zeroed pages, at every call
/// (glibc's adaptive default: a trim threshold of twice the largest freed
/// mapping, here 2 MiB, which such calls cross each time).
const TRIM_THRESHOLD: i32 = 64 << 20;
const MMAP_THRESHOLD: i32 = 32 << 20;

/// Sets [`TRIM_THRESHOLD`] and [`MMAP_THRESHOLD`] (glibc only), each
/// unless the program's environment sets it (`MALLOC_TRIM_THRESHOLD_`,
/// `MALLOC_MMAP_THRESHOLD_`).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (setting, variable, value) in [
        (
            libc::M_TRIM_THRESHOLD,
            "MALLOC_TRIM_THRESHOLD_",
            TRIM_THRESHOLD,
        ),
        (
            libc::M_MMAP_THRESHOLD,
            "MALLOC_MMAP_THRESHOLD_",
            MMAP_THRESHOLD,
        ),
    ] {
        if std::env::var_os(variable).is_none() {
            // SAFETY: mallopt only changes allocator settings; called
            // before the worker's runtime starts.
            unsafe { libc::mallopt(setting, value) };
        }
    }
}

async fn host(
    boot: WorkerBoot,
    registry: Arc<Registry>,
    hosted: HostedActor,
    panic: Arc<OnceLock<String>>,
    mut died: mpsc::UnboundedReceiver<DeathCause>,
) -> Result<i32, WorkerError> {
    let actor = boot.spec.actor;
    let WorkerIdentity {
        name: identity,
        credentials,
        ticket,
        head_keys,
    } = boot.identity.clone();
    let credentials = Credentials::from_worker(credentials);
    let socket = Endpoint::bind_socket(SocketAddr::new([0, 0, 0, 0].into(), 0))?;
    let port = socket
        .local_addr()
        .map_err(os("read the socket's address"))?
        .port();
    let me = PeerIdentity {
        role: PeerRole::Worker,
        identity: identity.clone(),
    };
    // Packet faults reach a worker only from a node plan with `workers`.
    let transport = TransportConfig {
        packet_faults: crate::transport::PacketFaults::from_env()?.filter(|plan| plan.workers),
        ..TransportConfig::default()
    };
    let endpoint = Endpoint::listen(socket, me, &credentials, transport)?;
    endpoint.certify(ticket.clone(), head_keys);
    let binary = std::env::current_exe().map_err(os("find this program's binary"))?;
    let context = ProcessContext::new(
        endpoint.clone(),
        boot.head,
        boot.node_address,
        registry.clone(),
        boot.spec.job.clone(),
        (binary, boot.spec.binary.clone()),
    );
    // The actors it spawns die with this incarnation (not a task's).
    let context = match boot.spec.type_name == TASK_WORKER {
        true => context,
        false => context.owning(ActorOwner {
            actor,
            incarnation: identity.incarnation,
        }),
    };
    if let Some(context) = ProcessContext::install(context) {
        crate::object_store::start(context);
        context.host_locally(actor, hosted.clone());
        tokio::spawn(keep_ticket(context, ticket));
    }
    crate::runtime::report_packet_faults(
        endpoint.clone(),
        boot.head,
        identity.name.clone(),
        crate::cluster::ProcessClass::Worker,
    );
    NodeOfWorker::set(NodeOfWorker {
        pid: std::os::unix::process::parent_id() as libc::pid_t,
        name: boot.node.name.clone(),
        is_head: boot.node_address == boot.head,
        runtime: tokio::runtime::Handle::current(),
    });
    let faults = HostedFaults {
        rules: boot.faults.clone(),
        target: boot
            .spec
            .name
            .clone()
            .unwrap_or_else(|| boot.spec.type_name.clone()),
        kill: Box::new(|fault: &FiredFault| {
            println!("{}", died_line(&DeathCause::ChaosFault(fault.clone())));
            let _ = std::io::stdout().flush();
            let _ = signal_process(std::process::id(), Signal::KILL);
        }),
        kill_node: kill_node_of_actor(),
    };
    let access = ActorAccess {
        job: boot.spec.job.clone(),
        shared: boot.spec.shared,
    };
    let host = ActorHost::new(
        registry,
        actor,
        boot.spec.type_name.clone(),
        access,
        hosted,
        panic,
        faults,
    );
    endpoint.serve(Arc::new(host));
    let address = SocketAddr::new(boot.advertise_ip, port);
    println!("{}", ready_line(address, identity.incarnation));
    let _ = std::io::stdout().flush();

    let mut terminate = signal(SignalKind::terminate()).map_err(os("handle SIGTERM"))?;
    let (code, cause) = tokio::select! {
        Some(cause) = died.recv() => (1, cause),
        _ = terminate.recv() => (0, DeathCause::Stopped),
    };
    // Stopped (its job ended): its last metrics reach its node before it
    // goes. A worker whose actor died goes at once, to be restarted; it
    // loses what it recorded since its last push, as a SIGKILLed one does.
    if let (DeathCause::Stopped, Some(context)) = (&cause, ProcessContext::current()) {
        if let Err(e) = context.push_metrics_now().await {
            tracing::debug!("last metrics push failed: {e}");
        }
    }
    println!("{}", died_line(&cause));
    let _ = std::io::stdout().flush();
    endpoint.shutdown().await;
    Ok(code)
}

/// How this worker's actor kills its node for a `kill_node` actor fault;
/// `None` on the head.
fn kill_node_of_actor() -> crate::actor::KillNode {
    Box::new(|fired: &FiredFault| {
        if NodeOfWorker::get().is_none_or(|node| node.is_head) {
            tracing::error!("{fired}: not injected, this worker's node is the head");
            return None;
        }
        let fired = fired.clone();
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

/// Records the first panic's message and reports it, after the default
/// hook has printed it to stderr (the worker's log); a panic its code
/// catches (a task function's) is only printed.
fn install_panic_hook(panic: Arc<OnceLock<String>>, died: mpsc::UnboundedSender<DeathCause>) {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        if crate::runtime::panic_is_caught() {
            return;
        }
        let cause = DeathCause::Panicked {
            message: panic_text(info.payload()),
        };
        if panic.set(cause.to_string()).is_ok() {
            let _ = died.send(cause);
        }
    }));
}
