//! What both halves use to move objects: the chunk size ([`CHUNK_BYTES`],
//! 8 MiB per request), the longest wait of one long poll
//! ([`MAX_OBJECT_WAIT`], 30 s), this host's identity (the kernel's boot id
//! and the device of `/dev/shm`: who may map a node's shared memory), and
//! chunked reads from a node (`ReadObject`, `READ_WINDOW`, 4, requests in
//! flight, bulk priority).

use futures::StreamExt;

use crate::client::{self, ClientError};
use crate::cluster::{ObjectId, ObjectLocation, ObjectReply, ObjectRequest, Subsystem};
use crate::transport::{Connection, RequestError, RequestOptions};

use super::error::ObjectStoreError;

/// Bytes per transfer request.
pub const CHUNK_BYTES: usize = 8 << 20;

/// The longest one `AwaitObject` or `PullObject` request waits.
pub const MAX_OBJECT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// This host's identity, as far as shared memory goes: its kernel's boot
/// id and the device of its `/dev/shm`. Containers or network namespaces
/// of one kernel share the boot id, but only those that share the
/// `/dev/shm` mount can open each other's files there.
pub(crate) fn host_id() -> &'static str {
    use std::os::unix::fs::MetadataExt;
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let boot = crate::transport::boot_id()
            .map(str::to_string)
            .unwrap_or_else(|| format!("unknown host, pid {}", std::process::id()));
        match std::fs::metadata("/dev/shm") {
            Ok(shm) => format!("{boot} shm {}", shm.dev()),
            Err(_) => boot,
        }
    })
}

/// Chunks in flight at once when reading an object.
const READ_WINDOW: usize = 4;

/// The chunks of object `id` (`size` bytes) held by `node`, in order, with
/// a few requests in flight to hide the round trips. `copy_at`: the node
/// that will keep a copy.
pub(crate) fn read_chunks(
    node: &Connection,
    id: ObjectId,
    size: u64,
    copy_at: Option<ObjectLocation>,
) -> impl futures::Stream<Item = Result<Vec<u8>, ObjectStoreError>> + '_ {
    let offsets = (0..size).step_by(CHUNK_BYTES);
    futures::stream::iter(offsets)
        .map(move |offset| {
            let copy_at = copy_at.clone();
            async move {
                let read = ObjectRequest::ReadObject {
                    id,
                    offset,
                    len: CHUNK_BYTES as u64,
                    copy_at,
                };
                match call(node, read, RequestOptions::bulk()).await? {
                    ObjectReply::Bytes(chunk) if !chunk.is_empty() => Ok(chunk),
                    other => Err(ObjectStoreError::Store(format!(
                        "object {id}: unexpected reply {other:?}"
                    ))),
                }
            }
        })
        .buffered(READ_WINDOW)
}

pub(crate) async fn call<R: Subsystem>(
    node: &Connection,
    request: R,
    options: RequestOptions,
) -> Result<R::Reply, ObjectStoreError> {
    match client::call(node, request, options).await {
        Ok(reply) => Ok(reply),
        Err(ClientError::Request(RequestError::Remote { error, .. })) => {
            Err(ObjectStoreError::Store(error.message))
        }
        Err(e) => Err(e.into()),
    }
}
