//! Actors as an operator sees them: listed, found by name or id, their
//! logs read from the node that has them, killed (`nimbus list actors`,
//! `nimbus logs`, `nimbus kill`).

use crate::cluster::{
    ActorId, ActorRecord, BundleListing, BundleReply, BundleRequest, Demand, DirectoryReply,
    DirectoryRequest, NodeStatus, UnexpectedReply, WorkerReply, WorkerRequest,
};
use crate::transport::RequestOptions;

use super::{call, ClientError, ClusterClient, LogChunk};

impl ClusterClient {
    /// The live actors (alive or restarting), as the head's directory lists
    /// them.
    pub async fn actors(&self) -> Result<Vec<ActorRecord>, ClientError> {
        match self.call(DirectoryRequest::ListActors).await? {
            DirectoryReply::Actors(actors) => Ok(actors),
            reply => Err(UnexpectedReply::new("ListActors", reply).into()),
        }
    }

    /// The dead actors the head keeps (the last 1,000 per job, 10,000 in
    /// all), oldest first, with their job and cause of death.
    pub async fn dead_actors(&self) -> Result<Vec<ActorRecord>, ClientError> {
        match self.call(DirectoryRequest::ListDeadActors).await? {
            DirectoryReply::Actors(actors) => Ok(actors),
            reply => Err(UnexpectedReply::new("ListDeadActors", reply).into()),
        }
    }

    /// The actor named `name` in job `job`, live or dead (the newest
    /// incarnation of that name there, as the head keeps the dead ones).
    pub async fn find_actor_in_job(
        &self,
        name: &str,
        job: &str,
    ) -> Result<Option<ActorRecord>, ClientError> {
        let named = |r: &ActorRecord| r.job == job && r.name.as_deref() == Some(name);
        if let Some(live) = self.actors().await?.into_iter().find(named) {
            return Ok(Some(live));
        }
        Ok(self.dead_actors().await?.into_iter().rev().find(named))
    }

    /// The actor named `name`, or with id `name` (16 hex digits, as
    /// listed), if the head knows it; by id it is found dead too.
    pub async fn find_actor(&self, name: &str) -> Result<Option<ActorRecord>, ClientError> {
        let request = match parse_id(name) {
            Some(id) => DirectoryRequest::LocateActor(id),
            None => DirectoryRequest::LookupName(name.to_string()),
        };
        match self.call(request).await? {
            DirectoryReply::Actor(found) => Ok(found.map(|record| *record)),
            reply => Err(UnexpectedReply::new("LookupName", reply).into()),
        }
    }

    /// Up to `max` bytes from `offset` of the stdout log (or with
    /// `stderr`, the stderr log) of `actor`'s newest worker process, read
    /// on the node it runs (or ran) on.
    pub async fn read_log(
        &self,
        actor: &ActorRecord,
        stderr: bool,
        offset: u64,
        max: u64,
    ) -> Result<LogChunk, ClientError> {
        let node = self.node_of(actor).await?;
        let request = WorkerRequest::ReadLog {
            actor: actor.actor,
            stderr,
            offset,
            max,
        };
        let connection = self.connect_node(&node).await?;
        match call(&connection, request, RequestOptions::bulk()).await? {
            WorkerReply::Log(chunk) => Ok(chunk),
            reply => Err(UnexpectedReply::new("ReadLog", reply).into()),
        }
    }

    /// The spawns waiting for room, longest waiting first.
    pub async fn demands(&self) -> Result<Vec<Demand>, ClientError> {
        match self.call(DirectoryRequest::ListDemands).await? {
            DirectoryReply::Demands(demands) => Ok(demands),
            reply => Err(UnexpectedReply::new("ListDemands", reply).into()),
        }
    }

    /// The placement-group bundles `node` holds.
    pub async fn bundles(&self, node: &NodeStatus) -> Result<Vec<BundleListing>, ClientError> {
        let connection = self.connect_node(node).await?;
        let request = BundleRequest::ListBundles;
        match call(&connection, request, RequestOptions::control()).await? {
            BundleReply::Bundles(bundles) => Ok(bundles),
            reply => Err(UnexpectedReply::new("ListBundles", reply).into()),
        }
    }

    /// Up to `max` bytes from `offset` of `node`'s own log.
    pub async fn read_node_log(
        &self,
        node: &NodeStatus,
        offset: u64,
        max: u64,
    ) -> Result<LogChunk, ClientError> {
        let request = WorkerRequest::ReadNodeLog { offset, max };
        let connection = self.connect_node(node).await?;
        match call(&connection, request, RequestOptions::bulk()).await? {
            WorkerReply::Log(chunk) => Ok(chunk),
            reply => Err(UnexpectedReply::new("ReadNodeLog", reply).into()),
        }
    }

    /// Kills `actor`'s worker for good (no restart), as `ray.kill` does.
    pub async fn kill_actor(&self, actor: &ActorRecord) -> Result<(), ClientError> {
        let node = self.node_of(actor).await?;
        let connection = self.connect_node(&node).await?;
        let request = WorkerRequest::KillActor(actor.actor);
        call(&connection, request, RequestOptions::control()).await?;
        Ok(())
    }

    /// The node `actor` is on, as the membership lists it.
    async fn node_of(&self, actor: &ActorRecord) -> Result<NodeStatus, ClientError> {
        self.status()
            .await?
            .node(&actor.node.name)
            .cloned()
            .ok_or_else(|| ClientError::NotFound {
                what: format!("node {} of actor {}", actor.node.name, actor.actor),
            })
    }
}

/// An actor id as listed: 16 hex digits.
fn parse_id(text: &str) -> Option<ActorId> {
    (text.len() == 16)
        .then(|| u64::from_str_radix(text, 16).ok())
        .flatten()
        .map(ActorId)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_sixteen_hex_digits_and_anything_else_is_a_name() {
        assert_eq!(parse_id("00000000000000ab"), Some(ActorId(0xab)));
        assert_eq!(
            parse_id(&ActorId(u64::MAX).to_string()),
            Some(ActorId(u64::MAX))
        );
        assert_eq!(parse_id("account-1"), None);
        assert_eq!(parse_id("ab"), None);
        assert_eq!(parse_id("zzzzzzzzzzzzzzzz"), None);
    }
}
