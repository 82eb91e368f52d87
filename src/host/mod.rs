//! This machine, as nimbus uses it: the private modes of every file and
//! directory it creates, the directories a node owns for its life, digests
//! of files, the GPUs it can count, and the node processes it can signal.
//! Everything here touches the file system, `/proc` or processes; the
//! cluster's shared types and protocol (`crate::cluster`) do not.
//!
//! Files: `files.rs` (private modes, durable writes, free space, the head
//! record), `ownership.rs` (directories a node owns for its life, and the
//! clean-up of those whose owner is provably gone), `digest.rs` (SHA-256
//! of files and bytes: binaries, checkpoints), `gpus.rs` (counting GPUs),
//! `probe.rs` (CPUs, memory, driver and library versions as the machine
//! states them),
//! `processes.rs` (node processes of this machine: alive, signalled,
//! stopped gracefully), `shared_memory.rs` (where nimbus keeps shared
//! memory: per user, node and job).

mod digest;
pub mod files;
pub mod gpus;
pub mod ownership;
pub mod probe;
pub mod processes;
pub mod shared_memory;

pub use digest::{sha256_bytes, sha256_file};
