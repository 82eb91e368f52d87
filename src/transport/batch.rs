//! Frames gathered to go out in one write (one system call on a same-host
//! socket): a channel's requests (`channel.rs`), a stream's responses
//! (`server/responses.rs`). Each side decides when to write; a batch holding
//! [`BATCH_BYTES`] or more is written at once.

use serde::Serialize;

use crate::wire::{self, WireError};

/// What a batch holds before it is written anyway.
const BATCH_BYTES: usize = 64 << 10;

/// Frames waiting to be written together.
#[derive(Default)]
pub(super) struct Batch(Vec<u8>);

impl Batch {
    /// Appends `value` as one frame of at most `max` bytes; on an error
    /// the batch is left as it was.
    pub(super) fn push<T: Serialize>(&mut self, value: &T, max: usize) -> Result<(), WireError> {
        wire::encode_into(value, max, &mut self.0)
    }

    /// Whether it holds [`BATCH_BYTES`] or more: time to write it.
    pub(super) fn full(&self) -> bool {
        self.0.len() >= BATCH_BYTES
    }

    /// Bytes it holds.
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Its bytes, to write.
    pub(super) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// Empties it, once written (or given up): a buffer grown past four
    /// batches by a large frame is freed rather than kept.
    pub(super) fn clear(&mut self) {
        self.0.clear();
        if self.0.capacity() > 4 * BATCH_BYTES {
            self.0 = Vec::new();
        }
    }
}
