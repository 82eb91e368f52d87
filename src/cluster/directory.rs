//! The cluster-wide directory on the head: which node hosts which actor,
//! by id and by unique name.
//!
//! Entries of a node that dies or leaves are dropped, so a lookup never
//! sends a caller to a dead incarnation. Actor placement (the next layer)
//! registers and looks up entries here.

use std::collections::HashMap;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use crate::wire::NodeIdentity;

use super::messages::{ClusterEvent, ClusterEventKind};

/// A cluster-unique actor id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ActorId(pub u64);

/// Where an actor lives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirectoryEntry {
    /// The actor.
    pub actor: ActorId,
    /// Its node (incarnation included).
    pub node: NodeIdentity,
}

/// Why a registration was refused.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DirectoryError {
    /// Names are unique in the cluster.
    #[error("the actor name {name:?} is taken by {holder:?}")]
    NameTaken {
        /// The name.
        name: String,
        /// Who has it.
        holder: DirectoryEntry,
    },
}

/// The directory actor.
#[derive(Default)]
pub struct Directory {
    by_id: HashMap<ActorId, (Option<String>, NodeIdentity)>,
    by_name: HashMap<String, ActorId>,
}

impl Actor for Directory {
    type Context = Context<Self>;
}

/// Record an actor, optionally under a unique name.
#[derive(Message)]
#[rtype(result = "Result<(), DirectoryError>")]
pub struct Register {
    /// The actor and its node.
    pub entry: DirectoryEntry,
    /// Its name, if any.
    pub name: Option<String>,
}

/// Find an actor by name.
#[derive(Message)]
#[rtype(result = "Option<DirectoryEntry>")]
pub struct Lookup(pub String);

/// Forget an actor.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Unregister(pub ActorId);

impl Directory {
    fn entry(&self, id: ActorId) -> Option<DirectoryEntry> {
        self.by_id.get(&id).map(|(_, node)| DirectoryEntry {
            actor: id,
            node: node.clone(),
        })
    }

    fn remove(&mut self, id: ActorId) {
        if let Some((Some(name), _)) = self.by_id.remove(&id) {
            self.by_name.remove(&name);
        }
    }
}

impl Handler<Register> for Directory {
    type Result = Result<(), DirectoryError>;

    fn handle(&mut self, msg: Register, _: &mut Self::Context) -> Self::Result {
        if let Some(name) = &msg.name {
            if let Some(holder) = self.by_name.get(name).and_then(|id| self.entry(*id)) {
                return Err(DirectoryError::NameTaken {
                    name: name.clone(),
                    holder,
                });
            }
            self.by_name.insert(name.clone(), msg.entry.actor);
        }
        self.by_id
            .insert(msg.entry.actor, (msg.name, msg.entry.node));
        Ok(())
    }
}

impl Handler<Lookup> for Directory {
    type Result = Option<DirectoryEntry>;

    fn handle(&mut self, Lookup(name): Lookup, _: &mut Self::Context) -> Self::Result {
        self.by_name.get(&name).and_then(|id| self.entry(*id))
    }
}

impl Handler<Unregister> for Directory {
    type Result = ();

    fn handle(&mut self, Unregister(id): Unregister, _: &mut Self::Context) {
        self.remove(id);
    }
}

impl Handler<ClusterEvent> for Directory {
    type Result = ();

    fn handle(&mut self, event: ClusterEvent, _: &mut Self::Context) {
        if let ClusterEventKind::NodeDead { node, .. } | ClusterEventKind::NodeLeft { node } =
            event.kind
        {
            let gone: Vec<ActorId> = self
                .by_id
                .iter()
                .filter(|(_, (_, n))| *n == node)
                .map(|(id, _)| *id)
                .collect();
            for id in gone {
                self.remove(id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Incarnation;

    fn node(name: &str) -> NodeIdentity {
        NodeIdentity {
            name: name.into(),
            incarnation: Incarnation(1),
        }
    }

    #[actix_rt::test]
    async fn names_are_unique_and_die_with_their_node() {
        let dir = Directory::default().start();
        let entry = DirectoryEntry {
            actor: ActorId(1),
            node: node("a"),
        };
        let register = |actor, name: &str| Register {
            entry: DirectoryEntry {
                actor,
                node: node("a"),
            },
            name: Some(name.into()),
        };
        dir.send(register(ActorId(1), "bank"))
            .await
            .unwrap()
            .unwrap();
        assert!(dir
            .send(register(ActorId(2), "bank"))
            .await
            .unwrap()
            .is_err());
        assert_eq!(dir.send(Lookup("bank".into())).await.unwrap(), Some(entry));
        dir.send(ClusterEvent {
            seq: 1,
            kind: ClusterEventKind::NodeDead {
                node: node("a"),
                reason: "test".into(),
            },
        })
        .await
        .unwrap();
        assert_eq!(dir.send(Lookup("bank".into())).await.unwrap(), None);
    }
}
