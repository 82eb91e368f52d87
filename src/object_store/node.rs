//! A node's object store: its shards, and pulls from other nodes.

use std::sync::Arc;

use actix::prelude::*;

use crate::cluster::{ControlReply, ControlRequest, ObjectId, ObjectListing};
use crate::transport::Endpoint;
use crate::wire::NodeIdentity;
use crate::wire::{RemoteError, RemoteErrorKind};
use futures::StreamExt;

use super::shard::{Abort, Append, Begin, Begun, Budget, List, ObjectStoreShard, Read};
use super::{read_chunks, CHUNK_BYTES};

/// Shards per node: objects are spread over them by id.
const SHARDS: u64 = 4;

/// The object store of one node.
#[derive(Clone)]
pub struct NodeObjectStore {
    shards: Vec<Addr<ObjectStoreShard>>,
    budget: Arc<Budget>,
    endpoint: Endpoint,
}

impl NodeObjectStore {
    /// Starts the shards, holding at most `capacity` bytes; pulls go
    /// through `endpoint`.
    pub fn start(capacity: u64, endpoint: Endpoint) -> Self {
        let budget = Budget::new(capacity);
        let shards = (0..SHARDS)
            .map(|_| ObjectStoreShard::new(budget.clone()).start())
            .collect();
        NodeObjectStore {
            shards,
            budget,
            endpoint,
        }
    }

    fn shard(&self, id: ObjectId) -> &Addr<ObjectStoreShard> {
        &self.shards[(id.0 % SHARDS) as usize]
    }

    /// Answers an object-store request, or hands it back if it is not one.
    pub async fn handle(
        &self,
        request: ControlRequest,
    ) -> Result<Result<ControlReply, RemoteError>, ControlRequest> {
        Ok(match request {
            ControlRequest::PutObjectChunk {
                id,
                offset,
                total,
                chunk,
            } => self
                .put_chunk(id, offset, total, chunk)
                .await
                .map(|()| ControlReply::Ack),
            ControlRequest::ReadObject { id, offset, len } => {
                let len = len.min(CHUNK_BYTES as u64);
                let read = self.shard(id).send(Read { id, offset, len }).await;
                flatten(read).map(ControlReply::ObjectBytes)
            }
            ControlRequest::PullObject {
                id,
                size,
                owner,
                address,
            } => self
                .pull(id, size, owner, address)
                .await
                .map(|()| ControlReply::Ack),
            ControlRequest::ListObjects => Ok(ControlReply::Objects(self.list().await)),
            other => return Err(other),
        })
    }

    async fn put_chunk(
        &self,
        id: ObjectId,
        offset: u64,
        total: u64,
        chunk: Vec<u8>,
    ) -> Result<(), RemoteError> {
        if offset == 0 {
            match flatten(self.shard(id).send(Begin { id, total }).await)? {
                Begun::Fresh => {}
                _ => return Err(bad(format!("object {id} exists already"))),
            }
        }
        let appended = flatten(self.shard(id).send(Append { id, offset, chunk }).await);
        if appended.is_err() {
            self.shard(id).do_send(Abort(id));
        }
        appended
    }

    /// Makes the object present here, fetching it from `owner` in chunks
    /// unless it is here or on its way.
    async fn pull(
        &self,
        id: ObjectId,
        size: u64,
        owner: NodeIdentity,
        address: std::net::SocketAddr,
    ) -> Result<(), RemoteError> {
        match flatten(self.shard(id).send(Begin { id, total: size }).await)? {
            Begun::Present => return Ok(()),
            Begun::InProgress(done) => {
                return done
                    .await
                    .map_err(|_| bad(format!("the transfer of object {id} failed")))
            }
            Begun::Fresh => {}
        }
        let fetched = self.fetch(id, size, &owner, address).await;
        if fetched.is_err() {
            self.shard(id).do_send(Abort(id));
        }
        fetched
    }

    async fn fetch(
        &self,
        id: ObjectId,
        size: u64,
        owner: &NodeIdentity,
        address: std::net::SocketAddr,
    ) -> Result<(), RemoteError> {
        let lost = |e: String| {
            RemoteError::new(
                RemoteErrorKind::Internal,
                format!("cannot pull object {id} from {owner}: {e}"),
            )
        };
        let connection = self
            .endpoint
            .connect(address, Some(owner))
            .await
            .map_err(|e| lost(e.to_string()))?;
        let mut offset = 0;
        let mut chunks = std::pin::pin!(read_chunks(&connection, id, size));
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| lost(e.to_string()))?;
            let len = chunk.len() as u64;
            flatten(self.shard(id).send(Append { id, offset, chunk }).await)?;
            offset += len;
        }
        Ok(())
    }

    async fn list(&self) -> ObjectListing {
        let mut objects = Vec::new();
        for shard in &self.shards {
            if let Ok(listed) = shard.send(List).await {
                objects.extend(listed);
            }
        }
        objects.sort();
        ObjectListing {
            objects,
            used: self.budget.used(),
            capacity: self.budget.capacity(),
        }
    }
}

fn bad(message: String) -> RemoteError {
    RemoteError::new(RemoteErrorKind::BadRequest, message)
}

fn flatten<T>(sent: Result<Result<T, String>, MailboxError>) -> Result<T, RemoteError> {
    match sent {
        Ok(result) => result.map_err(bad),
        Err(e) => Err(RemoteError::new(
            RemoteErrorKind::Internal,
            format!("object store shard unavailable: {e}"),
        )),
    }
}
