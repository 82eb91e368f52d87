//! What `Serve::status` answers: where the ingresses listen, and each
//! application's replicas with their health.

use std::net::SocketAddr;

use nimbus::cluster::ActorId;
use serde::{Deserialize, Serialize};

/// The state of serving.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServeStatus {
    /// The HTTP ingresses, one per node.
    pub ingresses: Vec<IngressAddress>,
    /// The deployed applications.
    pub applications: Vec<DeploymentStatus>,
}

/// Where one node's ingress listens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IngressAddress {
    /// The node.
    pub node: String,
    /// The address.
    pub address: SocketAddr,
}

/// One application.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeploymentStatus {
    /// Its name.
    pub name: String,
    /// The path prefix it serves.
    pub route_prefix: String,
    /// Its replicas.
    pub replicas: Vec<ReplicaStatus>,
    /// Replicas being started (a scale-up waiting for room, or for their
    /// health), not yet routed to.
    #[serde(default)]
    pub starting: u32,
}

/// One replica.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// Its actor.
    pub id: ActorId,
    /// Whether its last health check passed (it is routed to).
    pub healthy: bool,
    /// Why its last health check failed.
    pub error: Option<String>,
}
