//! A block: one Arrow record batch, stored in the object store as an
//! Arrow IPC stream (schema, the batch, end of stream).
//!
//! 1. The worker that made the batch encodes it (`Encoded`: its buffers
//!    copied once into Arrow's body layout, aligned to 64 bytes) and writes
//!    the stream straight into the object (`put_bytes_with`: in place into
//!    its node's shared memory when large, no copy before).
//! 2. The consumer gets them (`get_bytes`: mapped without a copy on the
//!    same host) and decodes them in place (`decode`): the arrays point
//!    into the mapping, which lives as long as any of them.

use std::io::Write;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::StreamDecoder;
use arrow_ipc::writer::{
    write_message, CompressionContext, DictionaryTracker, EncodedData, IpcDataGenerator,
    IpcWriteOptions,
};
use arrow_schema::ArrowError;
use nimbus::object_store::{self, ObjectBytes, ObjectRef, RawBytes};

use crate::error::DataError;

/// A batch encoded as an Arrow IPC stream, not yet written out: its
/// messages (schema, dictionaries, the batch), their buffers copied once
/// into Arrow's body layout, and the exact length of the stream, so that
/// it can be written straight into an object of that length.
pub(crate) struct Encoded {
    messages: Vec<EncodedData>,
    /// Each message's prefix, flatbuffer and padding, in bytes.
    headers: Vec<usize>,
    options: IpcWriteOptions,
}

/// The end-of-stream marker: a continuation and a zero length.
const END_OF_STREAM: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

impl Encoded {
    /// Encodes `batch` (buffers aligned to 64 bytes).
    pub(crate) fn new(batch: &RecordBatch) -> Result<Self, ArrowError> {
        let options = IpcWriteOptions::default();
        let generator = IpcDataGenerator::default();
        let mut tracker = DictionaryTracker::new(false);
        let schema = generator.schema_to_bytes_with_dictionary_tracker(
            &batch.schema(),
            &mut tracker,
            &options,
        );
        let (dictionaries, batch) = generator.encode(
            batch,
            &mut tracker,
            &options,
            &mut CompressionContext::default(),
        )?;
        let mut messages = vec![schema];
        messages.extend(dictionaries);
        messages.push(batch);
        let headers = messages
            .iter()
            .map(|message| {
                let header = EncodedData {
                    ipc_message: message.ipc_message.clone(),
                    arrow_data: Vec::new(),
                };
                write_message(std::io::sink(), header, &options).map(|(header, _)| header)
            })
            .collect::<Result<_, _>>()?;
        Ok(Encoded {
            messages,
            headers,
            options,
        })
    }

    /// The stream's length in bytes.
    pub(crate) fn len(&self) -> usize {
        let bodies: usize = self.messages.iter().map(|m| m.arrow_data.len()).sum();
        self.headers.iter().sum::<usize>() + bodies + END_OF_STREAM.len()
    }

    /// Writes the stream into `out`, exactly [`len`](Self::len) bytes.
    pub(crate) fn write_into(&self, mut out: &mut [u8]) -> Result<(), ArrowError> {
        for message in &self.messages {
            let header = EncodedData {
                ipc_message: message.ipc_message.clone(),
                arrow_data: Vec::new(),
            };
            write_message(&mut out, header, &self.options)?;
            out.write_all(&message.arrow_data)?;
        }
        out.write_all(&END_OF_STREAM)?;
        Ok(())
    }

    /// The stream in a buffer of its own.
    #[cfg(test)]
    fn to_vec(&self) -> Result<Vec<u8>, ArrowError> {
        let mut bytes = vec![0; self.len()];
        self.write_into(&mut bytes)?;
        Ok(bytes)
    }

    /// Puts the stream into the object store, written straight into the
    /// object (`put_bytes_with`); what failed, in words.
    pub(crate) async fn put(&self) -> Result<ObjectRef<RawBytes>, String> {
        let failed = std::sync::Mutex::new(None);
        let object = object_store::put_bytes_with(self.len(), |out| {
            if let Err(e) = self.write_into(out) {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
        })
        .await
        .map_err(|e| e.to_string())?;
        match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e.to_string()),
            None => Ok(object),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    #[test]
    fn a_batch_written_into_its_exact_length_decodes_back_in_place() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
        ]));
        let ids: Int64Array = (0..1000).collect();
        let names: StringArray = (0..1000)
            .map(|i| (i % 3 != 0).then(|| format!("n{i}")))
            .collect();
        let batch = RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(names)]).unwrap();
        let encoded = Encoded::new(&batch).unwrap();
        let bytes = encoded.to_vec().unwrap();
        assert_eq!(bytes.len(), encoded.len());
        let start = bytes.as_ptr() as usize;
        let end = start + bytes.len();
        let back = decode(ObjectBytes::Owned(bytes), 0).unwrap();
        assert_eq!(back, batch);
        // The arrays point into the block's own bytes: no copy was made.
        let values = back.column(0).to_data().buffers()[0].as_ptr() as usize;
        assert!((start..end).contains(&values));
        // One byte short: refused, not a panic.
        let mut short = vec![0; encoded.len() - 1];
        assert!(encoded.write_into(&mut short).is_err());
    }
}
