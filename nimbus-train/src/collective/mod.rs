//! Collectives between the workers of one training group: allreduce,
//! broadcast and barrier, behind one [`Collective`] interface.
//!
//! Backends:
//! - [`SharedMemoryGroup`]: CPU workers on one host exchange through one
//!   shared-memory segment (`/dev/shm`), no network copy at all, and no
//!   message;
//! - [`NetworkGroup`]: ring collectives over any ordered transport (between
//!   training workers: `CollectiveChunk` actor messages over QUIC), for
//!   groups across hosts;
//! - `NcclGroup` (`nccl.rs`, feature `cuda`): GPU workers, on device
//!   memory; rank 0 makes the group's id (`NcclUniqueId` message), which
//!   the supervisor hands to every rank;
//! - `SoloGroup`: a group of one.
//!
//! The supervisor picks one per attempt (`CollectiveBackend::Auto`: NCCL
//! with `use_gpu` when each worker holds whole GPUs, else shared memory on
//! one host, else the network; GPU workers sharing a device allreduce on
//! the host, since NCCL refuses two ranks on one device).
//! The CPU backends sum each value at one rank in a fixed order, so every
//! rank, and every run, gets the same bits.
//!
//! Every operation has a deadline (the run's `collective_timeout`) and
//! can be aborted from outside (the supervisor aborts survivors when a
//! peer dies), so a dead peer turns into an error, never a hang.
//!
//! ```
//! use nimbus_train::collective::{Collective, SoloGroup};
//! let mut group = SoloGroup;
//! let mut values = [1.0_f32, 2.0];
//! group.allreduce_mean(&mut values).unwrap();
//! assert_eq!(values, [1.0, 2.0]);
//! ```

#[cfg(feature = "cuda")]
pub mod nccl;
mod network;
mod shared_memory;

use std::time::Duration;

pub use network::{Chunk, Delivery, LinkClosed, NetworkGroup, SendChunk};
pub use shared_memory::{GroupAbort, SharedMemoryGroup, MAX_WORLD};

/// Why a collective operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// Some ranks did not arrive before the deadline.
    #[error("collective timed out after {after:?} waiting for ranks {missing:?}")]
    Timeout {
        /// The deadline.
        after: Duration,
        /// The ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// The group was aborted (a peer died, or the run is being stopped).
    #[error("collective group aborted: {0}")]
    Aborted(String),
    /// The group could not be formed.
    #[error("cannot form the collective group: {0}")]
    Setup(String),
    /// A buffer does not match the group's expectations.
    #[error("invalid collective buffer: {0}")]
    Invalid(String),
}

/// Collective operations over `f32` buffers, called by every rank of a
/// group in the same order.
pub trait Collective: Send {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Replaces `values` with the element-wise mean over all ranks. Every
    /// rank gets bit-identical results.
    fn allreduce_mean(&mut self, values: &mut [f32]) -> Result<(), CollectiveError>;
    /// Replaces `values` with the element-wise sum over all ranks.
    fn allreduce_sum(&mut self, values: &mut [f32]) -> Result<(), CollectiveError>;
    /// Copies `root`'s `values` to every rank.
    fn broadcast(&mut self, values: &mut [f32], root: usize) -> Result<(), CollectiveError>;
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CollectiveError>;

    /// Replaces every tensor with its mean over the group on the tensors'
    /// own (device) memory, if this backend can; `None` when it cannot, and
    /// the caller goes through host buffers instead.
    fn allreduce_mean_tensors(
        &mut self,
        _tensors: &[tch::Tensor],
    ) -> Option<Result<(), CollectiveError>> {
        None
    }

    /// Copies `root`'s tensors to every rank on the tensors' own (device)
    /// memory, if this backend can; `None` when it cannot, and the caller
    /// goes through host buffers instead.
    fn broadcast_tensors(
        &mut self,
        _tensors: &[tch::Tensor],
        _root: usize,
    ) -> Option<Result<(), CollectiveError>> {
        None
    }
}

/// The group of one: every operation is the identity. Used when training
/// runs in a single process.
#[derive(Debug, Default, Clone, Copy)]
pub struct SoloGroup;

impl Collective for SoloGroup {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn allreduce_mean(&mut self, _: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn allreduce_sum(&mut self, _: &mut [f32]) -> Result<(), CollectiveError> {
        Ok(())
    }
    fn broadcast(&mut self, _: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        if root == 0 {
            Ok(())
        } else {
            Err(CollectiveError::Invalid(format!(
                "broadcast root {root} in a group of 1"
            )))
        }
    }
    fn barrier(&mut self) -> Result<(), CollectiveError> {
        Ok(())
    }
}
