//! A block: one Arrow record batch, stored in the object store as an
//! Arrow IPC stream (schema, the batch, end of stream).
//!
//! 1. The worker that made the batch encodes it (`encode`, buffers aligned
//!    to 64 bytes) and puts the bytes (`put_bytes`: written in place into
//!    its node's shared memory when large).
//! 2. The consumer gets them (`get_bytes`: mapped without a copy on the
//!    same host) and decodes them in place (`decode`): the arrays point
//!    into the mapping, which lives as long as any of them.

use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{IpcWriteOptions, StreamWriter};
use nimbus::object_store::ObjectBytes;

use crate::error::DataError;

/// The Arrow IPC stream of `batch`.
pub(crate) fn encode(batch: &RecordBatch) -> Result<Vec<u8>, arrow_schema::ArrowError> {
    let mut bytes = Vec::with_capacity(batch.get_array_memory_size() + 4096);
    let options = IpcWriteOptions::default();
    let mut writer = StreamWriter::try_new_with_options(&mut bytes, &batch.schema(), options)?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(bytes)
}

/// The batch of block `block`, its arrays pointing into `bytes` (no copy
/// where the buffers are aligned, as `encode` writes them).
pub(crate) fn decode(bytes: ObjectBytes, block: usize) -> Result<RecordBatch, DataError> {
    let error = |detail: String| DataError::Decode { block, detail };
    let len = bytes.len();
    let start = NonNull::new(bytes.as_ptr().cast_mut()).ok_or_else(|| error("empty".into()))?;
    // SAFETY: `start..start+len` is the memory of `bytes`, immutable (a
    // sealed object's mapping or an owned buffer) and kept alive by the
    // `Arc` handed to the buffer as its owner.
    let mut buffer = unsafe { Buffer::from_custom_allocation(start, len, Arc::new(bytes)) };
    let mut decoder = StreamDecoder::new();
    let mut batch = None;
    while !buffer.is_empty() {
        if let Some(decoded) = decoder
            .decode(&mut buffer)
            .map_err(|e| error(e.to_string()))?
        {
            if batch.replace(decoded).is_some() {
                return Err(error("more than one batch".into()));
            }
        }
    }
    decoder.finish().map_err(|e| error(e.to_string()))?;
    batch.ok_or_else(|| error("no batch".into()))
}
