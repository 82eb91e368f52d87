//! Errors of the actor layer: one enum per operation.

use std::time::Duration;

use crate::client::ClientError;
use crate::cluster::{ActorId, ClusterStatus, NodeState, NodeStatus, ResourceSet};
use crate::launch::Strategy;

impl SpawnError {
    /// No alive node of `status` could ever fit `resources` (which the
    /// spawn or task needs, `needs` in words): why it waits, when the
    /// cluster's autoscaler has a node type that could and `strategy` lets
    /// a new node take it; else the error that says why nothing can.
    pub(crate) fn unless_autoscaled(
        status: &ClusterStatus,
        (needs, resources): (String, &ResourceSet),
        strategy: &Strategy,
    ) -> Result<String, Self> {
        match (strategy, &status.autoscaler) {
            (Strategy::Node(_), _) | (_, None) => {
                Err(SpawnError::unplaceable(needs, &status.nodes, strategy))
            }
            (_, Some(autoscaler)) => match autoscaler.type_for(resources) {
                Ok(fits) => Ok(format!(
                    "waiting for the autoscaler to start a {} node",
                    fits.name
                )),
                Err(detail) => Err(SpawnError::Unsatisfiable { needs, detail }),
            },
        }
    }

    /// Why nothing among `nodes` can take a spawn `strategy` places and
    /// which needs `needs`: its pinned node does not exist (`NoSuchNode`),
    /// or no alive node could ever fit it (`Unsatisfiable`).
    pub(crate) fn unplaceable(needs: String, nodes: &[NodeStatus], strategy: &Strategy) -> Self {
        if let Strategy::Node(name) = strategy {
            if !nodes.iter().any(|n| &n.id == name) {
                let known: Vec<&str> = nodes.iter().map(|n| n.id.as_str()).collect();
                return SpawnError::NoSuchNode {
                    node: name.clone(),
                    known: known.join(", "),
                };
            }
        }
        let offers: Vec<String> = nodes
            .iter()
            .filter(|n| n.state == NodeState::Alive)
            .map(|n| format!("{} offers {}", n.id, n.resources.total))
            .collect();
        SpawnError::Unsatisfiable {
            needs,
            detail: if offers.is_empty() {
                "no node is alive".into()
            } else {
                offers.join("; ")
            },
        }
    }
}

/// A call to an actor failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The actor (incarnation) is dead: it exited, panicked, was killed, or
    /// was restarted while the call was in flight.
    #[error("actor {actor} is dead: {reason}")]
    ActorDead {
        /// The actor.
        actor: ActorId,
        /// Why, as its node reported it.
        reason: String,
    },
    /// The actor's node was lost.
    #[error("actor {actor} was lost with its node: {reason}")]
    NodeLost {
        /// The actor.
        actor: ActorId,
        /// What the head said.
        reason: String,
    },
    /// No reply within the deadline (the call may still be carried out).
    #[error("actor {actor} did not answer within {after:?}")]
    Timeout {
        /// The actor.
        actor: ActorId,
        /// The deadline.
        after: Duration,
    },
    /// A message could not be encoded here (its `Serialize` failed).
    #[error("actor {actor}: {detail}")]
    Encode {
        /// The actor.
        actor: ActorId,
        /// What was wrong.
        detail: String,
    },
    /// A message or reply could not be decoded, or the receiving binary
    /// does not know the message type.
    #[error("actor {actor}: {detail}")]
    Decode {
        /// The actor.
        actor: ActorId,
        /// What was wrong.
        detail: String,
    },
    /// The handler failed (it panicked); the text is the remote one.
    #[error("actor {actor}'s handler failed: {message}")]
    Handler {
        /// The actor.
        actor: ActorId,
        /// The remote error text.
        message: String,
    },
    /// More calls in flight than the handle allows (`max_in_flight`).
    #[error("actor {actor} has {limit} calls in flight already (max_in_flight)")]
    MailboxFull {
        /// The actor.
        actor: ActorId,
        /// The limit.
        limit: u32,
    },
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// The head could not be asked where the actor is.
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClientError),
}

impl CallError {
    /// The error's kind, as the `outcome` label of
    /// `nimbus_actor_calls_total` (`crate::metrics`).
    pub fn kind(&self) -> &'static str {
        match self {
            CallError::ActorDead { .. } => "actor_dead",
            CallError::NodeLost { .. } => "node_lost",
            CallError::Timeout { .. } => "timeout",
            CallError::Encode { .. } => "encode",
            CallError::Decode { .. } => "decode",
            CallError::Handler { .. } => "handler",
            CallError::MailboxFull { .. } => "mailbox_full",
            CallError::NotInitialized => "not_initialized",
            CallError::Cluster(_) => "cluster",
        }
    }
}

/// Spawning an actor failed.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// The actor type is not in this program's registry.
    #[error("actor type {0} is not registered (write nimbus::remote_actor!(..) beside it, or add it to the Registry given to nimbus::init)")]
    NotRegistered(&'static str),
    /// No node could ever offer what the actor asks for.
    #[error("no node of the cluster offers {needs}: {detail}")]
    Unsatisfiable {
        /// The request.
        needs: String,
        /// What the nodes offer.
        detail: String,
    },
    /// The spawn is pinned to a node name no node of the cluster has (a
    /// name another cluster's nodes had, say): not a question of capacity.
    #[error("no node of the cluster is named {node:?} (its nodes: {known}); pin to a name `nimbus status` lists, or to one looked up in the cluster's status")]
    NoSuchNode {
        /// The name asked for.
        node: String,
        /// The names of the cluster's nodes.
        known: String,
    },
    /// Nodes could offer it, but none had it free before the deadline.
    #[error("no node had {needs} free within {after:?}: {last}")]
    NoCapacity {
        /// The request.
        needs: String,
        /// The deadline.
        after: Duration,
        /// The last refusal.
        last: String,
    },
    /// Another live actor has the name.
    #[error("the actor name {0:?} is taken")]
    NameTaken(String),
    /// An amount asked for is negative, infinite or NaN.
    #[error("invalid resources for the actor: {0}")]
    BadResources(#[from] crate::cluster::ResourceError),
    /// The constructor arguments could not be encoded.
    #[error("cannot encode the actor's arguments: {0}")]
    EncodeArgs(String),
    /// Starting it on the chosen node failed: the node could not start the
    /// worker process, or the program could not be shipped there.
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    /// The cluster could not be reached.
    #[error("cannot reach the cluster: {0}")]
    Cluster(#[from] ClientError),
    /// A peer answered with a reply of the wrong kind.
    #[error(transparent)]
    Unexpected(#[from] crate::cluster::UnexpectedReply),
}
