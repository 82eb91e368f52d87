//! What can go wrong with a dataset, each error naming the file, the
//! operator or the worker it concerns and, where one exists, the setting
//! to change.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// A dataset could not be built, read or consumed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A source path does not exist or cannot be listed.
    #[error("cannot read {path}: {detail}")]
    Path {
        /// The path given to the source.
        path: PathBuf,
        /// What the operating system said.
        detail: String,
    },
    /// A source found no file to read.
    #[error("{what}: no .{kind} file under {paths}")]
    NoFiles {
        /// The source (`read_parquet`).
        what: &'static str,
        /// The file extension looked for (without its dot).
        kind: &'static str,
        /// The paths given.
        paths: String,
    },
    /// A file is not valid of its format (corrupt, truncated, a codec this
    /// build does not read).
    #[error("{path}: {detail}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the row group where one is known.
        detail: String,
    },
    /// Two files of one dataset have different schemas.
    #[error("the files' schemas disagree: {first} has {first_schema}, {second} has {second_schema} (read them as two datasets, or select the columns they share with .select_columns)")]
    SchemaMismatch {
        /// The first file read.
        first: PathBuf,
        /// Its schema, in words.
        first_schema: String,
        /// The file that differs.
        second: PathBuf,
        /// Its schema, in words.
        second_schema: String,
    },
    /// A column named in the plan does not exist.
    #[error("{operator}: no column {column} (the columns are {columns})")]
    NoColumn {
        /// The operator naming it.
        operator: String,
        /// The missing column.
        column: String,
        /// The columns there are.
        columns: String,
    },
    /// A block failed in its worker: the user's function returned an
    /// error or panicked, or the block could not be read.
    #[error(transparent)]
    Block(#[from] BlockError),
    /// This process has not joined a cluster.
    #[error("this process is not connected to a cluster: call nimbus::init, then connect (Driver::block_on does)")]
    NotConnected,
    /// The function of an operator (named, as `filter(example.even)`) is
    /// not registered in this binary.
    #[error("the function of {0} is not registered in this binary (Registry::batch_fn, filter_fn or column_fn, of nimbus_data::RegistryExt)")]
    NotRegistered(String),
    /// A block worker could not be started.
    #[error("cannot start a block worker: {0} (ask for fewer with .concurrency, or fewer CPUs each with .num_cpus)")]
    Spawn(#[from] nimbus::actor::SpawnError),
    /// A block worker died more often than the retries allow.
    #[error("block {block} ({source_name}) was lost with its worker {attempts} times; last: {last} (raise .max_block_retries)")]
    WorkerLost {
        /// The block's index in the dataset.
        block: usize,
        /// Where its rows come from.
        source_name: String,
        /// How many times it was tried.
        attempts: u32,
        /// The last loss.
        last: String,
    },
    /// The object store could not store or give back a block.
    #[error("object store: {0}")]
    ObjectStore(#[from] nimbus::object_store::ObjectStoreError),
    /// A block's bytes are not an Arrow IPC stream of one batch.
    #[error("block {block}: not an Arrow IPC stream: {detail}")]
    Decode {
        /// The block's index.
        block: usize,
        /// Arrow's message.
        detail: String,
    },
    /// Writing the dataset out failed.
    #[error("cannot write {path}: {detail}")]
    Write {
        /// The file being written.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// An Arrow kernel refused the data (concatenating batches whose
    /// schemas differ, say).
    #[error("{what}: {detail}")]
    Arrow {
        /// What was being done.
        what: &'static str,
        /// Arrow's message.
        detail: String,
    },
    /// The consumer of another split of the same dataset stopped: the
    /// others stop too rather than wait for it.
    #[error("split {split} of {splits}: {detail}")]
    SplitConsumer {
        /// The split that failed or went away.
        split: usize,
        /// How many splits there are.
        splits: usize,
        /// What happened to it.
        detail: String,
    },
}

/// A block failed in its worker: travels back to the executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum BlockError {
    /// Its source could not be read.
    #[error("reading {source_name}: {detail}")]
    Read {
        /// The file (and row groups) or range.
        source_name: String,
        /// What failed.
        detail: String,
    },
    /// An operator failed on it: the user's function returned an error or
    /// panicked, or a column it names is missing.
    #[error("operator {operator} failed on the block from {source_name}: {detail}")]
    Operator {
        /// The operator (`map_batches(normalise)`).
        operator: String,
        /// Where the block's rows come from.
        source_name: String,
        /// The error or panic message.
        detail: String,
    },
    /// The block could not be stored.
    #[error("storing the block from {source_name}: {detail}")]
    Store {
        /// Where its rows come from.
        source_name: String,
        /// The object store's message.
        detail: String,
    },
}
