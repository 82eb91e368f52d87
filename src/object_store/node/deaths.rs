//! Worker deaths and ended jobs (step 5 of the node store's protocol,
//! `mod.rs`): the store follows the head's events, in process on the
//! head or over the network elsewhere, and drops the references of each
//! worker incarnation that died and of each ended job's drivers; after
//! missed events it resyncs against the head's directory and jobs.

use crate::cluster::{DirectoryReply, JobReply, Subsystem, UnexpectedReply};
use std::time::Duration;

use actix::prelude::*;

use super::shard::{DropDriver, DropWorker, Holders, ListHolders};
use super::NodeObjectStore;
use crate::client;
use crate::object_store::error::ObjectStoreError;
use crate::object_store::transfer::MAX_OBJECT_WAIT;
use crate::transport::{Endpoint, RequestOptions};

impl NodeObjectStore {
    /// Watches the head's events and releases the references of worker
    /// processes that die (`ActorDied`) and of the drivers of jobs that
    /// end (`JobEnded`): a SIGKILLed process never releases them itself.
    /// When events were missed (`Resync`: the head restarted), it asks the
    /// head instead (`NodeObjectStore::resync`). Runs until the node
    /// stops.
    pub fn watch_worker_deaths(&self, head: HeadEvents) {
        let store = self.clone();
        tokio::spawn(async move {
            // Deaths before this node's store started held nothing of it.
            let mut after = None;
            // A resync that could not finish is tried again after each poll.
            let mut resync_due = false;
            loop {
                let wait = if after.is_some() {
                    MAX_OBJECT_WAIT
                } else {
                    Duration::ZERO
                };
                let events = match head.since(&store.endpoint, after.unwrap_or(0), wait).await {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::warn!("object store: the head's events are unreachable ({e})");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let seen = after.replace(events.last().map_or(after.unwrap_or(0), |e| e.seq));
                if seen.is_none() {
                    continue;
                }
                for event in events {
                    match event.kind {
                        crate::cluster::ClusterEventKind::ActorDied {
                            actor, incarnation, ..
                        } => store.drop_worker(actor, incarnation).await,
                        crate::cluster::ClusterEventKind::JobEnded { job, .. } => {
                            store.drop_driver(job).await
                        }
                        crate::cluster::ClusterEventKind::Resync { .. } => resync_due = true,
                        _ => {}
                    }
                }
                if resync_due {
                    if let Err(e) = store.resync(&head).await {
                        tracing::warn!("object store: cannot resync with the head ({e}); trying again after the next poll");
                    } else {
                        resync_due = false;
                    }
                }
            }
        });
    }

    pub(super) async fn drop_worker(
        &self,
        actor: crate::cluster::ActorId,
        incarnation: crate::wire::Incarnation,
    ) {
        for shard in &self.shards {
            if let Ok(freed) = shard.send(DropWorker { actor, incarnation }).await {
                for object in freed {
                    tokio::spawn(self.clone().after_free(object));
                }
            }
        }
    }

    /// The deaths and job ends this store missed: the worker incarnations
    /// holding references here that the directory records dead or
    /// replaced by a newer incarnation, and the drivers of jobs that ended,
    /// release their references. A worker the directory does not know yet
    /// (its start is being recorded), and a driver of a job the head does
    /// not list, keep them. Every holder is checked; the last error, if
    /// any, is returned (the caller tries again).
    pub(super) async fn resync(&self, head: &HeadEvents) -> Result<(), ObjectStoreError> {
        let mut holders = Holders::default();
        for shard in &self.shards {
            if let Ok(listed) = shard.send(ListHolders).await {
                holders.workers.extend(listed.workers);
                holders.jobs.extend(listed.jobs);
            }
        }
        holders.workers.sort();
        holders.workers.dedup();
        holders.jobs.sort();
        holders.jobs.dedup();
        let mut failed = Ok(());
        for (actor, incarnation) in holders.workers {
            let record = match head.locate(&self.endpoint, actor).await {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(e) => {
                    failed = Err(e);
                    continue;
                }
            };
            let gone = incarnation < record.incarnation
                || (incarnation == record.incarnation && record.dead.is_some());
            if gone {
                self.drop_worker(actor, incarnation).await;
            }
        }
        if !holders.jobs.is_empty() {
            let jobs = head.jobs(&self.endpoint).await?;
            for job in holders.jobs {
                let ended = jobs.iter().any(|j| j.id == job && j.state.is_terminal());
                if ended {
                    self.drop_driver(job).await;
                }
            }
        }
        failed
    }

    pub(super) async fn drop_driver(&self, job: String) {
        for shard in &self.shards {
            let drop = DropDriver { job: job.clone() };
            if let Ok(freed) = shard.send(drop).await {
                for object in freed {
                    tokio::spawn(self.clone().after_free(object));
                }
            }
        }
    }
}

/// Where a node's store reads the head's events and, to resync, its
/// directory and jobs.
pub enum HeadEvents {
    /// On the head: its actors.
    Local {
        /// The event stream.
        events: Addr<crate::head::ClusterEvents>,
        /// The actor directory.
        directory: Addr<crate::head::Directory>,
        /// The job keeper.
        jobs: Addr<crate::head::jobs::Jobs>,
    },
    /// Elsewhere: the head's address.
    Remote(std::net::SocketAddr),
}

impl HeadEvents {
    pub(crate) async fn since(
        &self,
        endpoint: &Endpoint,
        after: u64,
        wait: Duration,
    ) -> Result<Vec<crate::cluster::ClusterEvent>, ObjectStoreError> {
        match self {
            HeadEvents::Local { events, .. } => {
                let since = crate::head::events::EventsSince { after, wait };
                events
                    .send(since)
                    .await
                    .map_err(|_| ObjectStoreError::EventsStopped)
            }
            HeadEvents::Remote(head) => {
                let connection = endpoint
                    .connect(*head, None)
                    .await
                    .map_err(client::ClientError::from)?;
                Ok(client::events(&connection, after, wait).await?)
            }
        }
    }

    /// The directory's record of `actor`, live or dead.
    pub(crate) async fn locate(
        &self,
        endpoint: &Endpoint,
        actor: crate::cluster::ActorId,
    ) -> Result<Option<crate::cluster::ActorRecord>, ObjectStoreError> {
        match self {
            HeadEvents::Local { directory, .. } => directory
                .send(crate::head::directory::LocateActor(actor))
                .await
                .map_err(|_| ObjectStoreError::EventsStopped),
            HeadEvents::Remote(head) => {
                let request = crate::cluster::DirectoryRequest::LocateActor(actor);
                match self.ask(endpoint, *head, request).await? {
                    DirectoryReply::Actor(record) => Ok(record.map(|r| *r)),
                    reply => Err(UnexpectedReply::new("LocateActor", reply).into()),
                }
            }
        }
    }

    /// Every job the head knows.
    async fn jobs(
        &self,
        endpoint: &Endpoint,
    ) -> Result<Vec<crate::cluster::JobRecord>, ObjectStoreError> {
        match self {
            HeadEvents::Local { jobs, .. } => jobs
                .send(crate::head::jobs::List)
                .await
                .map_err(|_| ObjectStoreError::EventsStopped),
            HeadEvents::Remote(head) => {
                let request = crate::cluster::JobRequest::ListJobs;
                match self.ask(endpoint, *head, request).await? {
                    JobReply::Jobs(jobs) => Ok(jobs),
                    reply => Err(UnexpectedReply::new("ListJobs", reply).into()),
                }
            }
        }
    }

    /// Asks the head at `head` (again while it is unreachable).
    async fn ask<R: Subsystem + Clone>(
        &self,
        endpoint: &Endpoint,
        head: std::net::SocketAddr,
        request: R,
    ) -> Result<R::Reply, ObjectStoreError> {
        let request = &request;
        let ask = |connection| async move {
            client::call(&connection, request.clone(), RequestOptions::control()).await
        };
        Ok(client::ask_head(endpoint, head, true, ask).await?)
    }
}
