//! Directory requests on the head: actor names and records, actors up and
//! down, spawns waiting for room (`crate::head::directory`).

use std::time::Duration;

use crate::cluster::{ActorRecord, DirectoryReply, DirectoryRequest};
use crate::head::demands::Waiter;
use crate::head::{directory, HeadActors};
use crate::transport::Caller;
use crate::wire::{PeerRole, RemoteError, RemoteErrorKind};

use super::unavailable;

/// Longest a waiting spawn is listed without saying it still waits.
const MAX_DEMAND_WAIT: Duration = Duration::from_secs(3600);
/// The most bundles of a waiting placement group the head keeps (the
/// demand table stays bounded whatever a creator sends).
const MAX_GROUP_BUNDLES: usize = 1024;

impl HeadActors {
    /// Answers a directory request from `from`.
    pub async fn answer_directory(
        &self,
        from: Caller,
        request: DirectoryRequest,
    ) -> Result<DirectoryReply, RemoteError> {
        let directory = &self.directory;
        match request {
            DirectoryRequest::ReserveName { name, actor } => {
                let reserved = directory
                    .send(directory::ReserveName { name, actor })
                    .await
                    .map_err(unavailable)?;
                Ok(match reserved {
                    Ok(()) => DirectoryReply::Ack,
                    Err(holder) => DirectoryReply::NameTaken(holder),
                })
            }
            DirectoryRequest::LookupName(name) => {
                let found = directory
                    .send(directory::LookupName(name))
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Actor(visible(&from, found)?.map(Box::new)))
            }
            DirectoryRequest::LocateActor(actor) => {
                let found = directory
                    .send(directory::LocateActor(actor))
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Actor(visible(&from, found)?.map(Box::new)))
            }
            DirectoryRequest::ActorUp { record, spec } => {
                directory
                    .send(directory::ActorUp { record, spec })
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
            DirectoryRequest::Waiting {
                actor,
                class,
                resources,
                job,
                for_ms,
                node,
            } => {
                let waiting = directory::Waiting {
                    actor,
                    what: (
                        crate::cluster::bounded_text(class),
                        resources,
                        crate::cluster::bounded_text(job),
                        node.map(crate::cluster::bounded_text),
                    ),
                    for_at_most: Duration::from_millis(for_ms).min(MAX_DEMAND_WAIT),
                };
                directory.send(waiting).await.map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
            DirectoryRequest::Placed(actor) => {
                directory
                    .send(directory::Placed(Waiter::Actor(actor)))
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
            DirectoryRequest::GroupWaiting {
                mut group,
                job,
                for_ms,
            } => {
                group.bundles.truncate(MAX_GROUP_BUNDLES);
                let waiting = directory::GroupWaiting {
                    group,
                    job: crate::cluster::bounded_text(job),
                    for_at_most: Duration::from_millis(for_ms).min(MAX_DEMAND_WAIT),
                };
                directory.send(waiting).await.map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
            DirectoryRequest::GroupPlaced(group) => {
                directory
                    .send(directory::Placed(Waiter::Group(group)))
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
            DirectoryRequest::TasksWaiting {
                queue,
                resources,
                count,
                job,
            } => {
                let waiting = directory::TasksWaiting {
                    queue,
                    what: (resources, crate::cluster::bounded_text(job)),
                    count,
                };
                directory.send(waiting).await.map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
            DirectoryRequest::ListDemands => Ok(DirectoryReply::Demands(
                directory
                    .send(directory::ListDemands)
                    .await
                    .map_err(unavailable)?,
            )),
            DirectoryRequest::ListActors => {
                let actors = directory
                    .send(directory::ListActors)
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Actors(actors))
            }
            DirectoryRequest::ListDeadActors => {
                let actors = directory
                    .send(directory::ListDeadActors)
                    .await
                    .map_err(unavailable)?;
                Ok(DirectoryReply::Actors(actors))
            }
            DirectoryRequest::ActorDown {
                actor,
                incarnation,
                reason,
                restarting,
            } => {
                let down = directory::ActorDown {
                    actor,
                    incarnation,
                    reason,
                    restarting,
                    node: from
                        .certified_as(PeerRole::Node)
                        .then(|| from.peer.identity.clone()),
                };
                directory.send(down).await.map_err(unavailable)?;
                Ok(DirectoryReply::Ack)
            }
        }
    }
}

/// `record` as `from` may see it: a worker finds only its own job's actors
/// and shared ones (`ActorSpec::shared`); anyone else finds any.
fn visible(from: &Caller, record: Option<ActorRecord>) -> Result<Option<ActorRecord>, RemoteError> {
    match (from.worker_scope(), record) {
        (Some(scope), Some(record)) if !record.shared && record.job != scope.job => {
            Err(RemoteError::new(
                RemoteErrorKind::Forbidden,
                format!(
                    "actor {} ({}) is job {}'s and not shared: a worker of job {} finds only its own job's actors and shared ones (spawn it with SpawnOptions::shared)",
                    record.actor,
                    record.name.as_deref().unwrap_or(&record.type_name),
                    record.job,
                    scope.job
                ),
            ))
        }
        (_, record) => Ok(record),
    }
}
