//! nimbus Data: streaming datasets from files into training workers (Ray
//! Data), on Arrow, run by block workers on a nimbus cluster.
//!
//! A [`Dataset`] is a plan: a source (parquet, CSV or JSON-lines files, a
//! range, batches in memory) and operators (`map_batches` with a registered
//! [`BatchFn`], `filter` with a [`FilterFn`], `with_column` with a
//! [`ColumnFn`], `select_columns`, `rename_columns`, `limit`). Consuming it
//! (`iter_batches`, `count`, `take`, `streaming_split`, `materialize`, the
//! writers) runs it:
//!
//! 1. **Plan** (in the consuming process): the source becomes splits, one
//!    block each: a parquet row group (from the files' footers, the
//!    projection pushed down), a CSV or JSON-lines file, 65,536 integers,
//!    one in-memory batch.
//! 2. **Make** (`worker.rs`): block workers, actors in worker processes of
//!    the cluster, each read a split, run the operators, and put the
//!    result into the object store as an Arrow IPC stream (`block.rs`).
//! 3. **Stream** (`executor/`): the consumer pulls blocks in split order;
//!    splits start only while the blocks stored and not yet consumed, plus
//!    those being made, fit the memory budget (`executor/state.rs`), so a
//!    slow consumer holds the workers back instead of growing memory.
//!    Blocks are mapped from shared memory and decoded in place.
//! 4. **Faults**: a lost worker is replaced and its splits run again; an
//!    error of a file or of the user's function fails the dataset, naming
//!    the file (and row group) and the operator.
//!
//! The user's functions are registered by name on the program's registry
//! (as task functions are), since the block workers run the same binary:
//!
//! ```no_run
//! use nimbus_data::{BatchFn, Dataset, RegistryExt};
//! const IDENTITY: BatchFn = BatchFn::new("example.identity");
//!
//! fn main() -> anyhow::Result<()> {
//!     let registry = nimbus::actor::Registry::new()
//!         .batch_fn(IDENTITY, |batch| Ok::<_, String>(batch));
//!     let driver = nimbus::init(registry)?;
//!     driver.block_on(async {
//!         let rows = Dataset::range(1_000).map_batches(IDENTITY).count().await?;
//!         assert_eq!(rows, 1_000);
//!         Ok(())
//!     })
//! }
//! ```

mod batches;
mod block;
mod dataset;
mod error;
mod executor;
mod functions;
mod plan;
mod shard;
mod source;
mod split;
mod stats;
mod worker;
mod write;

pub use batches::BatchStream;
pub use dataset::{Dataset, DEFAULT_BLOCK_RETRIES, DEFAULT_CONCURRENCY, DEFAULT_MEMORY_BUDGET};
pub use error::{BlockError, DataError};
pub use executor::SPLITS_PER_WORKER;
pub use functions::{BatchFn, ColumnFn, FilterFn, RegistryExt};
pub use shard::{BlockingBatches, Shard};
pub use source::text::INFER_RECORDS;
pub use split::{
    Alive, DataSplit, Leave, NextSlice, SliceRef, SplitCoordinator, SplitPlan, FIRST_WORD,
    HEARTBEAT, RECHECK, SILENCE,
};
pub use stats::{DatasetStats, OperatorStats};
pub use worker::{BlockWorker, MadeBlock, MakeBlock};

/// Arrow's record batch, schema, arrays and selection kernels, at the
/// version blocks are made with.
pub use arrow_array;
pub use arrow_schema;
pub use arrow_select;
/// The parquet crate, at the version the sources and writers use.
pub use parquet;
