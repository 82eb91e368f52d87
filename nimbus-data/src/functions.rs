//! Batch functions: the user's code a `map_batches` runs, registered by a
//! stable name in every process of the program (as task functions are),
//! so a block worker started from the same binary finds it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use nimbus::actor::Registry;

/// The name of a batch function: declare one as a constant and use it both
/// to register (`Registry::batch_fn`) and in `Dataset::map_batches`.
///
/// ```
/// use nimbus_data::{BatchFn, RegistryExt};
/// const IDENTITY: BatchFn = BatchFn::new("example.identity");
/// let registry = nimbus::actor::Registry::new()
///     .batch_fn(IDENTITY, |batch| Ok::<_, String>(batch));
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BatchFn {
    name: &'static str,
}

impl BatchFn {
    /// The function registered as `name` (stable across builds).
    pub const fn new(name: &'static str) -> Self {
        BatchFn { name }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// A batch function's type-erased entry point.
pub(crate) type BatchRun = Arc<dyn Fn(RecordBatch) -> Result<RecordBatch, String> + Send + Sync>;

/// The batch functions a program registered, by name (its table in the
/// [`Registry`]).
#[derive(Clone, Default)]
pub(crate) struct BatchTable(HashMap<&'static str, BatchRun>);

impl BatchTable {
    /// The function registered as `name` in `registry`.
    pub(crate) fn lookup(registry: &Registry, name: &str) -> Option<BatchRun> {
        registry.table::<BatchTable>()?.0.get(name).cloned()
    }
}

/// Registers batch functions on a program's [`Registry`].
pub trait RegistryExt {
    /// Registers `run` as batch function `function`. An `Err` it returns,
    /// or a panic, fails the dataset with the operator's name and the
    /// block's source. It runs in block workers, one block at a time per
    /// worker, and may compute as long as it needs.
    fn batch_fn<E: std::fmt::Display>(
        self,
        function: BatchFn,
        run: impl Fn(RecordBatch) -> Result<RecordBatch, E> + Send + Sync + 'static,
    ) -> Self;
}

impl RegistryExt for Registry {
    fn batch_fn<E: std::fmt::Display>(
        self,
        function: BatchFn,
        run: impl Fn(RecordBatch) -> Result<RecordBatch, E> + Send + Sync + 'static,
    ) -> Self {
        let entry: BatchRun = Arc::new(move |batch| run(batch).map_err(|e| e.to_string()));
        self.extend(|table: &mut BatchTable| {
            table.0.insert(function.name, entry);
        })
    }
}
