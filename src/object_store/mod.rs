//! The object store: immutable values put once and read anywhere in the
//! cluster by reference (first part: in-memory shards, chunked cross-node
//! pulls with caching; no reference counting, spilling or shared memory
//! yet — objects live as long as the node that holds them).
//!
//! A process puts into its *home* node's store (a worker's own node; the
//! head for a driver). `get` asks the home node to pull the object from the
//! node holding it (once: the copy is cached there, and concurrent pulls of
//! one object share one transfer), then reads it from the home node in
//! chunks into a buffer allocated once.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nimbus::object_store::ObjectStoreError> {
//! let weights = nimbus::object_store::put(&vec![0.5f32; 1024]).await?;
//! // Pass `weights` (a small handle) inside messages; read it anywhere:
//! let back: Vec<f32> = nimbus::object_store::get(&weights).await?;
//! # Ok(()) }
//! ```

mod node;
mod shard;

use std::marker::PhantomData;
use std::net::SocketAddr;

use futures::StreamExt;
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::actor::ProcessContext;
use crate::client::{self, ClientError};
use crate::cluster::{ControlReply, ControlRequest, ObjectId};
use crate::transport::{Connection, RequestError, RequestOptions};
use crate::wire::NodeIdentity;

pub use node::NodeObjectStore;
pub use shard::{Budget, ObjectStoreShard};

/// Bytes per transfer request.
pub const CHUNK_BYTES: usize = 8 << 20;

/// Marks references to raw bytes ([`put_bytes`]/[`get_bytes`]).
#[derive(Debug)]
pub enum RawBytes {}

/// A reference to an object of type `T`: small, serializable, valid
/// anywhere in the cluster.
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ObjectRef<T> {
    id: ObjectId,
    size: u64,
    owner: NodeIdentity,
    address: SocketAddr,
    #[serde(skip)]
    value: PhantomData<fn() -> T>,
}

impl<T> Clone for ObjectRef<T> {
    fn clone(&self) -> Self {
        ObjectRef {
            id: self.id,
            size: self.size,
            owner: self.owner.clone(),
            address: self.address,
            value: PhantomData,
        }
    }
}

impl<T> std::fmt::Debug for ObjectRef<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ObjectRef({}, {} bytes on {})",
            self.id, self.size, self.owner
        )
    }
}

impl<T> ObjectRef<T> {
    /// The object's id.
    pub fn id(&self) -> ObjectId {
        self.id
    }

    /// Its size in bytes (serialized).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The node holding the original.
    pub fn owner(&self) -> &NodeIdentity {
        &self.owner
    }
}

/// A put or get failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// `nimbus::init` and `Driver::connect` have not run in this process.
    #[error("nimbus is not initialised in this process: call nimbus::init(..) and Driver::connect() first")]
    NotInitialized,
    /// The value could not be encoded or decoded.
    #[error("object {what}: {detail}")]
    Codec {
        /// Encoding or decoding.
        what: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// A node refused: its store is full (`--object-store-memory`), or it
    /// does not have the object.
    #[error("{0}")]
    Store(String),
    /// The cluster could not be reached.
    #[error("cannot reach the object store: {0}")]
    Cluster(#[from] ClientError),
}

/// Puts `value` (MessagePack) into this process's home node's store.
pub async fn put<T: Serialize>(value: &T) -> Result<ObjectRef<T>, ObjectStoreError> {
    let bytes = rmp_serde::to_vec_named(value).map_err(|e| ObjectStoreError::Codec {
        what: "encoding",
        detail: e.to_string(),
    })?;
    store(&bytes).await
}

/// Puts raw bytes (a tensor, a file) into this process's home node's store.
pub async fn put_bytes(bytes: &[u8]) -> Result<ObjectRef<RawBytes>, ObjectStoreError> {
    store(bytes).await
}

/// Reads an object put with [`put`].
pub async fn get<T: DeserializeOwned>(object: &ObjectRef<T>) -> Result<T, ObjectStoreError> {
    let bytes = fetch(object.id, object.size, &object.owner, object.address).await?;
    rmp_serde::from_slice(&bytes).map_err(|e| ObjectStoreError::Codec {
        what: "decoding",
        detail: e.to_string(),
    })
}

/// Reads an object put with [`put_bytes`].
pub async fn get_bytes(object: &ObjectRef<RawBytes>) -> Result<Vec<u8>, ObjectStoreError> {
    fetch(object.id, object.size, &object.owner, object.address).await
}

async fn home() -> Result<(Connection, SocketAddr), ObjectStoreError> {
    let context = ProcessContext::current().ok_or(ObjectStoreError::NotInitialized)?;
    let connection = context
        .endpoint
        .connect(context.home, None)
        .await
        .map_err(ClientError::from)?;
    Ok((connection, context.home))
}

async fn store<T>(bytes: &[u8]) -> Result<ObjectRef<T>, ObjectStoreError> {
    let (home, address) = home().await?;
    let id = ObjectId::random();
    let total = bytes.len() as u64;
    let mut offset = 0;
    // An empty object still needs its first (empty) chunk to exist.
    let chunks: Vec<&[u8]> = if bytes.is_empty() {
        vec![&[]]
    } else {
        bytes.chunks(CHUNK_BYTES).collect()
    };
    for chunk in chunks {
        let request = ControlRequest::PutObjectChunk {
            id,
            offset,
            total,
            chunk: chunk.to_vec(),
        };
        call(&home, &request).await?;
        offset += chunk.len() as u64;
    }
    Ok(ObjectRef {
        id,
        size: total,
        owner: home.peer().clone(),
        address,
        value: PhantomData,
    })
}

async fn fetch(
    id: ObjectId,
    size: u64,
    owner: &NodeIdentity,
    address: SocketAddr,
) -> Result<Vec<u8>, ObjectStoreError> {
    let (home, _) = home().await?;
    if home.peer() != owner {
        let pull = ControlRequest::PullObject {
            id,
            size,
            owner: owner.clone(),
            address,
        };
        call(&home, &pull).await?;
    }
    let mut bytes = Vec::with_capacity(size as usize);
    let mut chunks = std::pin::pin!(read_chunks(&home, id, size));
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    Ok(bytes)
}

/// Chunks in flight at once when reading an object.
const READ_WINDOW: usize = 4;

/// The chunks of object `id` (`size` bytes) held by `node`, in order, with
/// a few requests in flight to hide the round trips.
pub(crate) fn read_chunks(
    node: &Connection,
    id: ObjectId,
    size: u64,
) -> impl futures::Stream<Item = Result<Vec<u8>, ObjectStoreError>> + '_ {
    let offsets = (0..size).step_by(CHUNK_BYTES);
    futures::stream::iter(offsets)
        .map(move |offset| async move {
            let read = ControlRequest::ReadObject {
                id,
                offset,
                len: CHUNK_BYTES as u64,
            };
            match call(node, &read).await? {
                ControlReply::ObjectBytes(chunk) if !chunk.is_empty() => Ok(chunk),
                other => Err(ObjectStoreError::Store(format!(
                    "object {id}: unexpected reply {other:?}"
                ))),
            }
        })
        .buffered(READ_WINDOW)
}

async fn call(
    node: &Connection,
    request: &ControlRequest,
) -> Result<ControlReply, ObjectStoreError> {
    match client::call(node, request, RequestOptions::bulk()).await {
        Ok(reply) => Ok(reply),
        Err(ClientError::Request(RequestError::Remote { error, .. })) => {
            Err(ObjectStoreError::Store(error.message))
        }
        Err(e) => Err(e.into()),
    }
}
