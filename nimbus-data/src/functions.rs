//! The user's functions a dataset's operators run: batch functions
//! (`map_batches`), row predicates (`filter`) and column functions
//! (`with_column`), each registered by a stable name in every process of
//! the program (as task functions are), so a block worker started from the
//! same binary finds it.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
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

/// The name of a row predicate, for `Dataset::filter`: registered with
/// `Registry::filter_fn`, it answers, for a batch, which of its rows to
/// keep (a null keeps none).
///
/// ```
/// use nimbus_data::arrow_array::{BooleanArray, Int64Array};
/// use nimbus_data::{FilterFn, RegistryExt};
/// const EVEN: FilterFn = FilterFn::new("example.even");
/// let registry = nimbus::actor::Registry::new().filter_fn(EVEN, |batch| {
///     let ids = batch.column(0).as_any().downcast_ref::<Int64Array>().ok_or("not Int64")?;
///     Ok::<_, &str>(ids.iter().map(|id| id.map(|id| id % 2 == 0)).collect::<BooleanArray>())
/// });
/// ```
#[derive(Clone, Copy, Debug)]
pub struct FilterFn {
    name: &'static str,
}

impl FilterFn {
    /// The predicate registered as `name` (stable across builds).
    pub const fn new(name: &'static str) -> Self {
        FilterFn { name }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// The name of a column function, for `Dataset::with_column`: registered
/// with `Registry::column_fn`, it computes a column of as many rows as the
/// batch it is given.
#[derive(Clone, Copy, Debug)]
pub struct ColumnFn {
    name: &'static str,
}

impl ColumnFn {
    /// The function registered as `name` (stable across builds).
    pub const fn new(name: &'static str) -> Self {
        ColumnFn { name }
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// A batch function's type-erased entry point.
pub(crate) type BatchRun = dyn Fn(RecordBatch) -> Result<RecordBatch, String> + Send + Sync;
/// A row predicate's type-erased entry point.
pub(crate) type FilterRun = dyn Fn(&RecordBatch) -> Result<BooleanArray, String> + Send + Sync;
/// A column function's type-erased entry point.
pub(crate) type ColumnRun = dyn Fn(&RecordBatch) -> Result<ArrayRef, String> + Send + Sync;

/// The functions of one kind a program registered, by name (a table of
/// the [`Registry`]).
pub(crate) struct Table<F: ?Sized>(HashMap<&'static str, Arc<F>>);

impl<F: ?Sized> Default for Table<F> {
    fn default() -> Self {
        Table(HashMap::new())
    }
}

impl<F: ?Sized> Clone for Table<F> {
    fn clone(&self) -> Self {
        Table(self.0.clone())
    }
}

impl<F: ?Sized + Send + Sync + 'static> Table<F> {
    /// The function registered as `name` in `registry`.
    pub(crate) fn lookup(registry: &Registry, name: &str) -> Option<Arc<F>> {
        registry.table::<Table<F>>()?.0.get(name).cloned()
    }

    /// `registry` with `run` added as `name`.
    fn register(registry: Registry, name: &'static str, run: Arc<F>) -> Registry {
        registry.extend(|table: &mut Table<F>| {
            table.0.insert(name, run);
        })
    }
}

/// Registers the functions of datasets' operators on a program's
/// [`Registry`]. An `Err` a function returns, or a panic, fails the
/// dataset with the operator's name and the block's source. They run in
/// block workers, one block at a time per worker, and may compute as long
/// as they need.
pub trait RegistryExt {
    /// Registers `run` as batch function `function` (`map_batches`).
    fn batch_fn<E: std::fmt::Display>(
        self,
        function: BatchFn,
        run: impl Fn(RecordBatch) -> Result<RecordBatch, E> + Send + Sync + 'static,
    ) -> Self;

    /// Registers `run` as row predicate `predicate` (`filter`): one value
    /// per row of the batch, true to keep it.
    fn filter_fn<E: std::fmt::Display>(
        self,
        predicate: FilterFn,
        run: impl Fn(&RecordBatch) -> Result<BooleanArray, E> + Send + Sync + 'static,
    ) -> Self;

    /// Registers `run` as column function `function` (`with_column`): one
    /// value per row of the batch.
    fn column_fn<E: std::fmt::Display>(
        self,
        function: ColumnFn,
        run: impl Fn(&RecordBatch) -> Result<ArrayRef, E> + Send + Sync + 'static,
    ) -> Self;
}

impl RegistryExt for Registry {
    fn batch_fn<E: std::fmt::Display>(
        self,
        function: BatchFn,
        run: impl Fn(RecordBatch) -> Result<RecordBatch, E> + Send + Sync + 'static,
    ) -> Self {
        let run: Arc<BatchRun> = Arc::new(move |batch| run(batch).map_err(|e| e.to_string()));
        Table::register(self, function.name, run)
    }

    fn filter_fn<E: std::fmt::Display>(
        self,
        predicate: FilterFn,
        run: impl Fn(&RecordBatch) -> Result<BooleanArray, E> + Send + Sync + 'static,
    ) -> Self {
        let run: Arc<FilterRun> = Arc::new(move |batch| run(batch).map_err(|e| e.to_string()));
        Table::register(self, predicate.name, run)
    }

    fn column_fn<E: std::fmt::Display>(
        self,
        function: ColumnFn,
        run: impl Fn(&RecordBatch) -> Result<ArrayRef, E> + Send + Sync + 'static,
    ) -> Self {
        let run: Arc<ColumnRun> = Arc::new(move |batch| run(batch).map_err(|e| e.to_string()));
        Table::register(self, function.name, run)
    }
}
