//! Starting and stopping a node process (the steps are in the module docs
//! of [`crate::node`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::client::{self, ClientError};
use crate::cluster::faults::ActorFault;
use crate::cluster::MembershipRequest;
use crate::cluster::{
    MembershipReply, NodeRegistration, ObjectLocation, ResourceSet, Versions, MEMORY,
};
use crate::head::events::Subscribe;
use crate::head::jobs::Jobs;
use crate::head::membership::{self, Membership};
use crate::head::state::LibraryState;
use crate::head::store::HeadStart;
use crate::head::{ActorRescheduler, ClusterEvents, Directory, HeadActors};
use crate::host::files::free_bytes;
use crate::host::ownership::remove_stale;
use crate::metrics::{MetricsServer, ProcessMetrics};
use crate::object_store::{HeadEvents, NodeObjectStore};
use crate::transport::{
    unix_now, CertificateHash, Credentials, Endpoint, PacketFaults, RequestOptions,
    TicketAuthority, WorkerSigner,
};
use crate::wire::{HeadKeys, Ticket};
use crate::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};

use super::{
    DriverRunner, HeadLink, NodeConfig, NodeError, NodeManager, NodeManagerConfig, NodeRole,
    NodeService, WorkerIdentities, WorkerSandbox,
};

/// What a node reports once it serves.
#[derive(Clone, Debug)]
pub struct NodeReady {
    /// Its identity.
    pub identity: NodeIdentity,
    /// Where it is reached.
    pub address: SocketAddr,
    /// What it offers.
    pub resources: ResourceSet,
    /// Where it serves `/metrics`, if it does.
    pub metrics: Option<SocketAddr>,
}

/// Runs a node until SIGTERM/SIGINT (`Ok`) or a fatal error. `on_ready` is
/// called once the node serves and, for a member, has joined.
pub fn run(config: NodeConfig, on_ready: impl FnOnce(&NodeReady)) -> Result<(), NodeError> {
    raise_open_file_limit();
    let system = System::new();
    let result = system.block_on(serve(config, on_ready));
    System::current().stop();
    result
}

/// Raises this process's soft limit on open files to its hard limit (as
/// the limits of many shells start at 1,024 of a far higher hard limit): a
/// node holds a descriptor per worker pipe, object file, log and HTTP
/// connection, and its workers inherit the limit. Left as it is, saying
/// so, if it cannot be raised.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 || limit.rlim_cur >= limit.rlim_max
        {
            return;
        }
        let wanted = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) != 0 {
            let error = std::io::Error::last_os_error();
            tracing::warn!(
                "cannot raise the open-file limit from {} to {}: {error}",
                limit.rlim_cur,
                limit.rlim_max
            );
        }
    }
}

async fn serve(config: NodeConfig, on_ready: impl FnOnce(&NodeReady)) -> Result<(), NodeError> {
    crate::metrics::install();
    let resources = config.resources.resolve()?;
    crate::host::files::own_state_dir(&config.state_dir)?;
    let sandbox = WorkerSandbox::start(config.worker_sandbox, &config.state_dir)?;
    let (endpoint, mut bound) = bind(&config)?;
    let (identity, address) = (bound.identity.clone(), bound.address);
    let registration = NodeRegistration {
        node: identity.clone(),
        address,
        resources: resources.clone(),
        versions: Versions::here(),
    };
    let link = match config.role.clone() {
        NodeRole::Head {
            heartbeat_timeout,
            ticket_lifetime,
            store,
        } => {
            let timeouts = (heartbeat_timeout, config.driver_grace, config.head_grace);
            let tickets = TicketAuthority::from_pkcs8(&store.ticket_key)?
                .with_rotation(store.ticket_rotation.as_ref())?
                .with_lifetime(ticket_lifetime);
            start_head(
                &endpoint,
                &mut bound,
                registration,
                (store, tickets),
                timeouts,
            )
            .await?
        }
        NodeRole::Member { head } => {
            let joined = join(&endpoint, head, registration, bound.signer.public_key()).await?;
            endpoint.certify(joined.ticket.clone(), joined.head_keys.clone());
            bound.signer.set_ticket(joined.ticket);
            Link {
                interval: joined.interval,
                head: HeadLink::Remote {
                    endpoint: endpoint.clone(),
                    head,
                },
                actors: None,
                address: head,
                head_keys: joined.head_keys,
            }
        }
    };
    let is_member = link.actors.is_none();
    let head_address = link.address;
    let (fatal_tx, mut fatal_rx) = mpsc::unbounded_channel();
    let me = ObjectLocation {
        node: identity.clone(),
        address,
    };
    let head = (&link.actors, head_address);
    let objects = start_object_store(&config, &resources, &endpoint, me, head)?;
    let sandbox = sandbox.with_objects(objects.shared_dir(), config.worker_sandbox)?;
    let manager = NodeManager::new(NodeManagerConfig {
        identity: identity.clone(),
        address,
        total: resources.clone(),
        head: link.head,
        head_address,
        interval: link.interval,
        head_grace: config.head_grace,
        fatal: fatal_tx,
        workers: WorkerIdentities::new(config.token.clone(), bound.signer, link.head_keys),
        endpoint: endpoint.clone(),
        advertise_ip: address.ip(),
        state_dir: config.state_dir.clone(),
        actor_faults: ActorFault::from_env()?,
        log_max: config.log_max,
        sandbox,
    })
    .start();
    // Actors die with the actor incarnation that spawned them.
    super::manager::follow_owners(manager.clone(), head_events(head), endpoint.clone());
    let drivers = DriverRunner::new(
        config.state_dir.clone(),
        config.log_max,
        config.token.clone(),
        endpoint.clone(),
        head_address,
    )
    .start();
    let processes = Arc::new(std::sync::Mutex::new(ProcessMetrics::default()));
    crate::metrics::set_node_processes(processes.clone());
    let metrics = match config.metrics_export {
        Some(port) => {
            let address = SocketAddr::new(config.metrics_host.unwrap_or(address.ip()), port);
            let store = objects.clone();
            let before_scrape = move || store.record_metrics();
            Some(MetricsServer::start(
                address,
                processes.clone(),
                before_scrape,
            )?)
        }
        None => None,
    };
    endpoint.serve(Arc::new(NodeService::new(
        manager,
        drivers,
        link.actors,
        objects.clone(),
        endpoint.clone(),
        processes,
    )));
    crate::runtime::report_packet_faults(
        endpoint.clone(),
        head_address,
        identity.name.clone(),
        crate::cluster::ProcessClass::Node,
    );
    // Handlers first: a SIGTERM sent as soon as the node reports ready must
    // stop it cleanly, not kill it with the default action.
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    info!(node = %identity, %address, %resources, "node up");
    on_ready(&NodeReady {
        identity: identity.clone(),
        address,
        metrics: metrics.as_ref().map(|server| {
            let mut shown = server.address();
            if shown.ip().is_unspecified() {
                shown.set_ip(address.ip());
            }
            shown
        }),
        resources,
    });

    let outcome = tokio::select! {
        _ = terminate.recv() => Ok(()),
        _ = interrupt.recv() => Ok(()),
        Some(error) = fatal_rx.recv() => Err(error),
    };
    if let (true, Ok(())) = (is_member, &outcome) {
        if let Err(e) = leave(&endpoint, head_address, identity.clone()).await {
            warn!("could not tell the head this node is leaving: {e}");
        }
    }
    if let Some(faults) = endpoint.fault_counters() {
        info!(node = %identity, "packet faults injected: {faults}");
    }
    info!(node = %identity, "node stopping");
    endpoint.shutdown().await;
    objects.stop();
    outcome
}

/// Step 1–2: binds the port, picks a fresh incarnation, issues this
/// process's certificate and starts serving QUIC (with the packet fault
/// plan of the environment, if any).
fn bind(config: &NodeConfig) -> Result<(Endpoint, Bound), NodeError> {
    let socket = Endpoint::bind_socket(config.listen)?;
    let port = socket.local_addr()?.port();
    let ip = config.advertise_ip.unwrap_or_else(detect_ip);
    let address = SocketAddr::new(ip, port);
    let identity = NodeIdentity {
        name: config
            .node_name
            .clone()
            .unwrap_or_else(|| address.to_string()),
        incarnation: Incarnation::fresh(),
    };
    NodeIdentity::check_name(&identity.name)?;
    let credentials = Credentials::issue(&config.token, &identity.name)?;
    let me = PeerIdentity {
        role: PeerRole::Node,
        identity: identity.clone(),
    };
    let mut transport = config.transport.clone();
    if let Some(plan) = PacketFaults::from_env()? {
        transport.packet_faults = Some(plan);
    }
    let endpoint = Endpoint::listen(socket, me, &credentials, transport)?;
    let bound = Bound {
        signer: WorkerSigner::generate(&identity)?,
        certificate: credentials.certificate_hash(),
        identity,
        address,
    };
    Ok((endpoint, bound))
}

/// What [`bind`] made besides the endpoint.
struct Bound {
    identity: NodeIdentity,
    address: SocketAddr,
    /// The certificate the endpoint presents.
    certificate: CertificateHash,
    /// This node's key for its workers' tickets.
    signer: WorkerSigner,
}

/// How this node reaches the control plane.
struct Link {
    /// The node manager's way to the head.
    head: HeadLink,
    /// The heartbeat interval.
    interval: Duration,
    /// The control-plane actors, on the head.
    actors: Option<HeadActors>,
    /// The head's address.
    address: SocketAddr,
    /// The head's public ticket keys.
    head_keys: HeadKeys,
}

/// Heartbeats per heartbeat timeout: a node is declared dead after missing
/// about this many.
const BEATS_PER_TIMEOUT: u32 = 6;

/// Step 3, on the head: starts the control-plane actors and registers this
/// node with them.
async fn start_head(
    endpoint: &Endpoint,
    bound: &mut Bound,
    registration: NodeRegistration,
    (store, tickets): (HeadStart, TicketAuthority),
    (heartbeat_timeout, driver_grace, head_grace): (Duration, Duration, Duration),
) -> Result<Link, NodeError> {
    let interval = heartbeat_timeout / BEATS_PER_TIMEOUT;
    // The head certifies itself like any node (`tickets.rs`, step 2), with
    // the key its store keeps: its members' tickets outlive its restarts.
    let tickets = Arc::new(tickets);
    let epoch = store.store.next_epoch()?;
    let ticket = tickets.certify_node(
        &bound.identity,
        bound.certificate,
        &bound.signer.public_key(),
        unix_now(),
    );
    endpoint.certify(ticket.clone(), tickets.public_keys(unix_now()).into());
    bound.signer.set_ticket(ticket);
    let address = registration.address;
    let events = ClusterEvents::for_epoch(epoch).start();
    let lost = store.lost_nodes()?;
    let lost_nodes = lost.clone();
    let (nodes, actors, stored_jobs) = (store.nodes, store.actors, store.jobs);
    let state = LibraryState::new(Some(store.store.clone()), store.records).start();
    let membership = Membership::new(
        heartbeat_timeout,
        events.clone(),
        store.store.clone(),
        (nodes, head_grace),
    )
    .start();
    let directory = Directory::create(|ctx| {
        let rescheduler = ActorRescheduler::new(
            endpoint.clone(),
            membership.clone(),
            events.clone(),
            ctx.address(),
        )
        .start();
        Directory::new(events.clone(), Some(rescheduler.recipient())).stored(
            store.store.clone(),
            actors,
            lost,
        )
    });
    events.do_send(Subscribe(directory.clone().recipient()));
    let join = membership::Join {
        registration,
        head: true,
    };
    membership
        .send(join)
        .await
        .map_err(|e| NodeError::Runtime(std::io::Error::other(e)))?
        .map_err(|e| NodeError::Expelled(e.to_string()))?;
    let head = HeadLink::Local {
        membership: membership.clone(),
        tickets: tickets.clone(),
        directory: directory.clone(),
    };
    let head_keys = tickets.public_keys(unix_now()).into();
    let jobs = Jobs::new(
        driver_grace,
        endpoint.clone(),
        address,
        membership.clone(),
        events.clone(),
    )
    .stored(store.store.clone(), stored_jobs, &lost_nodes)
    .start();
    events.do_send(Subscribe(jobs.clone().recipient()));
    let actors = HeadActors {
        membership,
        events,
        directory,
        jobs,
        state,
        heartbeat_interval: interval,
        tickets,
        store: store.store,
    };
    Ok(Link {
        head,
        interval,
        actors: Some(actors),
        address,
        head_keys,
    })
}

/// Where a node's objects go: its spill directory (its own, inside the
/// one it is given: it removes that one when it stops, never the user's)
/// and its shared-memory directory under `shm` (`None` without tmpfs).
fn object_dirs(
    config: &NodeConfig,
    node: &str,
    pid: u32,
    shm: Option<&Path>,
) -> (PathBuf, Option<PathBuf>) {
    let own = format!("{}-{pid}", file_name_part(node));
    let spill_dir = match &config.object_spill_dir {
        Some(dir) => dir.join(format!("nimbus-{own}")),
        None => config.state_dir.join("spill").join(&own),
    };
    let shared_dir =
        shm.map(|shm| crate::host::shared_memory::user_dir(shm).join(format!("nimbus-{own}")));
    (spill_dir, shared_dir)
}

/// Step 4, the object store: removes what killed nodes left behind, then
/// starts the store with its share of the node's memory (the configured
/// amount, else 30 %), and releases the references of workers that die.
fn start_object_store(
    config: &NodeConfig,
    resources: &ResourceSet,
    endpoint: &Endpoint,
    me: ObjectLocation,
    head: (&Option<HeadActors>, SocketAddr),
) -> Result<NodeObjectStore, NodeError> {
    let store_memory = config
        .object_store_memory
        .unwrap_or((resources.amount(MEMORY) * 0.3) as u64);
    // Large objects live in tmpfs files that processes of this host map.
    let shm = Path::new("/dev/shm");
    let stale = [
        (crate::host::shared_memory::user_dir(shm), "nimbus-"),
        (shm.to_path_buf(), "nimbus-"),
        (config.state_dir.join("spill"), ""),
    ];
    let user_spill = config
        .object_spill_dir
        .iter()
        .map(|d| (d.clone(), "nimbus-"));
    for (parent, prefix) in stale.into_iter().chain(user_spill) {
        for removed in remove_stale(&parent, prefix) {
            tracing::info!("removed {}, left by a node that is gone", removed.display());
        }
    }
    let tmpfs = Some(shm).filter(|shm| shm.is_dir());
    if let Some(free) = tmpfs
        .and_then(free_bytes)
        .filter(|&free| free < store_memory)
    {
        tracing::warn!(
            "{} has {} MiB free, less than this node's object store ({} MiB): large objects that do not fit there are kept in the node's memory, where processes of this host cannot map them; give the host or container a larger /dev/shm (docker run --shm-size) or lower --object-store-memory",
            shm.display(),
            free >> 20,
            store_memory >> 20
        );
    }
    let (spill_dir, shared_dir) = object_dirs(config, &me.node.name, std::process::id(), tmpfs);
    let objects = NodeObjectStore::start(
        store_memory,
        spill_dir,
        shared_dir,
        config.object_arrival_timeout,
        endpoint.clone(),
        me,
    )?;
    // Worker processes' references die with them.
    objects.watch_worker_deaths(head_events(head));
    Ok(objects)
}

/// Where this node follows the head's events: in process on the head.
fn head_events(head: (&Option<HeadActors>, SocketAddr)) -> HeadEvents {
    match head {
        (Some(actors), _) => HeadEvents::Local {
            events: actors.events.clone(),
            directory: actors.directory.clone(),
            jobs: actors.jobs.clone(),
        },
        (None, address) => HeadEvents::Remote(address),
    }
}

/// Tells the head this node is stopping on purpose.
async fn leave(
    endpoint: &Endpoint,
    head: SocketAddr,
    node: NodeIdentity,
) -> Result<(), ClientError> {
    let connection = endpoint.connect(head, None).await?;
    let options = RequestOptions::control().with_deadline(Duration::from_secs(2));
    client::call(&connection, MembershipRequest::Leave { node }, options).await?;
    Ok(())
}

/// How long past the first answer's `retry_after` a join keeps trying
/// for a name held by a member that is not declared dead yet.
const NAME_GRACE: Duration = Duration::from_secs(2);

/// What the head answered a join with.
struct Joined {
    /// The heartbeat interval it asks for.
    interval: Duration,
    /// This node's ticket.
    ticket: Ticket,
    /// The head's public ticket keys.
    head_keys: HeadKeys,
}

/// Joins the head, naming the key this node signs its workers' tickets
/// with (`signs_workers`).
///
/// A name still held by a live member is retried when the head says the
/// holder, if it has stopped, will have been declared dead (a node
/// restarted before the head noticed its death), until [`NAME_GRACE`]
/// past that; a holder that is still heartbeating keeps the name, and the
/// join fails saying so.
async fn join(
    endpoint: &Endpoint,
    head: SocketAddr,
    registration: NodeRegistration,
    signs_workers: Vec<u8>,
) -> Result<Joined, NodeError> {
    let failed = |cause: ClientError| NodeError::Join { head, cause };
    let connection = endpoint
        .connect(head, None)
        .await
        .map_err(|e| failed(e.into()))?;
    let request = MembershipRequest::Join {
        registration,
        signs_workers,
    };
    let mut give_up = None;
    loop {
        let reply = client::call(&connection, request.clone(), RequestOptions::control()).await;
        let (holder, address, retry_after_ms) = match reply {
            Ok(MembershipReply::Joined {
                heartbeat_interval_ms,
                ticket,
                head_keys,
            }) => {
                return Ok(Joined {
                    interval: Duration::from_millis(heartbeat_interval_ms.max(1)),
                    ticket,
                    head_keys,
                })
            }
            Ok(MembershipReply::NodeNameTaken {
                holder,
                address,
                retry_after_ms,
            }) => (holder, address, retry_after_ms),
            Ok(reply) => {
                return Err(failed(ClientError::from(
                    crate::cluster::UnexpectedReply::new("Join", reply),
                )))
            }
            Err(e) => return Err(failed(e)),
        };
        let taken = NodeError::NameTaken {
            head,
            holder: holder.clone(),
            address,
        };
        let Some(wait) = retry_after_ms.map(Duration::from_millis) else {
            return Err(taken);
        };
        let now = tokio::time::Instant::now();
        let give_up = *give_up.get_or_insert(now + wait + NAME_GRACE);
        if now + wait > give_up {
            return Err(taken);
        }
        info!(%holder, "the node name is held by an incarnation not yet declared dead; joining again in {wait:?}");
        tokio::time::sleep(wait).await;
    }
}

/// The address other hosts most likely reach this one at: the source
/// address of the default route, or loopback on a machine without one.
pub fn detect_ip() -> IpAddr {
    let probe = || -> std::io::Result<IpAddr> {
        let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
        // connect() on UDP sends nothing; it only picks a route.
        socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9))?;
        Ok(socket.local_addr()?.ip())
    };
    probe().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// `name` with every character but ASCII letters, digits, `.`, `:`, `_` and
/// `-` replaced by `_`, so it names one file inside a directory.
fn file_name_part(name: &str) -> String {
    let part: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | ':' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    if part.chars().all(|c| c == '.') {
        part.replace('.', "_")
    } else {
        part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_spills_into_its_own_directory_inside_the_one_it_is_given() {
        let member = NodeRole::Member {
            head: "127.0.0.1:6379".parse().unwrap(),
        };
        let mut config = NodeConfig::new(member, crate::transport::JoinToken::generate());
        config.state_dir = PathBuf::from("/state");
        let shm = Some(Path::new("/dev/shm"));
        let (spill, shared) = object_dirs(&config, "node/1", 42, shm);
        assert_eq!(spill, Path::new("/state/spill/node_1-42"));
        // SAFETY: geteuid cannot fail.
        let uid = unsafe { libc::geteuid() };
        let expected = format!("/dev/shm/nimbus-objects-{uid}/nimbus-node_1-42");
        assert_eq!(shared.as_deref(), Some(Path::new(&expected)));
        config.object_spill_dir = Some(PathBuf::from("/mnt/nvme"));
        let (spill, shared) = object_dirs(&config, "..", 7, None);
        assert_eq!(spill, Path::new("/mnt/nvme/nimbus-__-7"));
        assert_eq!(shared, None);
    }
}
