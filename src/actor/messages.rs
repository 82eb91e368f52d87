//! What callers send to worker processes.

use serde::{Deserialize, Serialize};

use crate::cluster::ActorId;

/// One message for the actor a worker hosts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ActorCall {
    /// The actor meant (a worker hosts one).
    pub actor: ActorId,
    /// The message's registered name.
    pub message: String,
    /// The message, MessagePack.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
}
