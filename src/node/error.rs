//! Why a node could not start or had to stop.

use std::net::SocketAddr;
use std::time::Duration;

use crate::client::ClientError;
use crate::cluster::ResourceError;
use crate::transport::{CredentialError, EndpointError};

/// A node failed to start, or stopped on an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// `--num-cpus`, `--num-gpus`, `--memory` or `--resources` is invalid.
    #[error(transparent)]
    Resources(#[from] ResourceError),
    /// The token is unusable.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// The port is taken, or QUIC could not start.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The head could not be reached, refused us, or refused to admit us.
    #[error("cannot join the head at {head}: {cause}")]
    Join {
        /// The head's address.
        head: SocketAddr,
        /// What went wrong.
        cause: ClientError,
    },
    /// The head declared this node dead (it was unreachable for longer than
    /// the heartbeat timeout); restart it to rejoin as a new incarnation.
    #[error("the head no longer counts this node as a member: {0}")]
    Expelled(String),
    /// The head did not answer heartbeats for `head_lost_timeout`.
    #[error("lost the head: no heartbeat acknowledged for {0:?}")]
    HeadLost(Duration),
    /// A fault plan in the environment (`NIMBUS_PACKET_FAULTS`,
    /// `NIMBUS_ACTOR_FAULTS`) is malformed.
    #[error("{0}")]
    FaultPlan(String),
    /// The async runtime or signal handling failed.
    #[error("node runtime: {0}")]
    Runtime(#[from] std::io::Error),
}
