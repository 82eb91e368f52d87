//! Node settings.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::cluster::{ResourceOverrides, DEFAULT_HEAD_GRACE};
use crate::head::store::HeadStart;
use crate::host::files::nimbus_home;
use crate::transport::{JoinToken, TransportConfig};

use super::logs::DEFAULT_LOG_MAX;
use super::sandbox::SandboxMode;

/// Head or not.
// One per node process: boxing the head's settings would save no memory.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum NodeRole {
    /// Runs the control plane.
    Head {
        /// A node silent for this long is declared dead (at most 3 s by
        /// default). Nodes heartbeat at a sixth of it.
        heartbeat_timeout: Duration,
        /// How long the node tickets it signs are valid
        /// (`--ticket-lifetime-s`; `crate::transport`'s `tickets.rs`,
        /// step 7).
        ticket_lifetime: Duration,
        /// Its store, opened, with what it held (`head/store.rs`).
        store: HeadStart,
    },
    /// Joins the head at this address.
    Member {
        /// The head's address.
        head: SocketAddr,
    },
}

/// Everything a node needs to start.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Head or member.
    pub role: NodeRole,
    /// The cluster's secret.
    pub token: JoinToken,
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// The IP other processes reach this node at; detected when `None`.
    pub advertise_ip: Option<IpAddr>,
    /// Stable name; `IP:PORT` when `None`.
    pub node_name: Option<String>,
    /// Resources given on the command line.
    pub resources: ResourceOverrides,
    /// A member that cannot reach the head for this long exits; a restarted
    /// head gives the members it knew this long to come back
    /// (`--head-grace-s`, [`DEFAULT_HEAD_GRACE`] by default).
    pub head_grace: Duration,
    /// Transport settings.
    pub transport: TransportConfig,
    /// Where the node keeps program binaries and worker logs.
    pub state_dir: PathBuf,
    /// Bytes its object store may hold; 30% of the node's memory when `None`.
    pub object_store_memory: Option<u64>,
    /// A directory inside which its object store spills, into a
    /// `nimbus-NODE-PID` directory of its own that it removes when it stops
    /// (the given directory is never removed); `state_dir/spill/NODE-PID`
    /// when `None`.
    pub object_spill_dir: Option<PathBuf>,
    /// An object put that sends no bytes for this long is abandoned
    /// (`object_store::ARRIVAL_TIMEOUT` by default).
    pub object_arrival_timeout: Duration,
    /// Head only: a job whose driver is silent for this long ends
    /// (`head::jobs::DEFAULT_DRIVER_GRACE` by default).
    pub driver_grace: Duration,
    /// A worker's or job driver's log past this many bytes is rotated
    /// (`logs.rs`; [`DEFAULT_LOG_MAX`] by default).
    pub log_max: u64,
    /// Serve `/metrics` on this port (`crate::metrics`; 0: any free port)
    /// of [`metrics_host`](Self::metrics_host); none when `None`.
    pub metrics_export: Option<u16>,
    /// The address `/metrics` binds; `None`: the node's advertised address
    /// (never every interface unless asked).
    pub metrics_host: Option<IpAddr>,
    /// What the sandbox of its workers must hold (`--worker-sandbox`,
    /// `sandbox/`).
    pub worker_sandbox: SandboxMode,
}

/// `$NIMBUS_HOME`, else `~/.nimbus` (see [`nimbus_home`]).
pub fn default_state_dir() -> PathBuf {
    nimbus_home()
}

impl NodeConfig {
    /// Default settings for `role` with `token`.
    pub fn new(role: NodeRole, token: JoinToken) -> Self {
        NodeConfig {
            role,
            token,
            listen: ([0, 0, 0, 0], 0).into(),
            advertise_ip: None,
            node_name: None,
            resources: ResourceOverrides::default(),
            head_grace: DEFAULT_HEAD_GRACE,
            transport: TransportConfig::default(),
            state_dir: default_state_dir(),
            object_store_memory: None,
            object_spill_dir: None,
            object_arrival_timeout: crate::object_store::ARRIVAL_TIMEOUT,
            driver_grace: crate::head::jobs::DEFAULT_DRIVER_GRACE,
            log_max: DEFAULT_LOG_MAX,
            metrics_export: None,
            metrics_host: None,
            worker_sandbox: SandboxMode::Auto,
        }
    }
}
