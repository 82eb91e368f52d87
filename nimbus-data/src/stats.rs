//! What a dataset's execution did, per operator (`Dataset::stats` after a
//! run): rows and bytes out, wall and CPU time in the block workers, and
//! the executor's own figures (memory budget and peak, time the workers
//! were held back by it, time the consumer waited for blocks).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One step of one block in its worker.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct StepTime {
    pub(crate) rows: u64,
    pub(crate) bytes: u64,
    pub(crate) wall: Duration,
    pub(crate) cpu: Duration,
}

/// One operator's totals over the blocks it made.
#[derive(Clone, Debug, Default)]
pub struct OperatorStats {
    /// Its name (`read_parquet`, `map_batches(normalise)`, `encode`: to
    /// Arrow IPC, `store`: into the object store).
    pub name: String,
    /// Blocks it ran on.
    pub blocks: u64,
    /// Rows it put out.
    pub rows: u64,
    /// Bytes it put out (Arrow's memory size; the IPC size for `encode`
    /// and `store`).
    pub bytes: u64,
    /// Wall time, summed over blocks.
    pub wall: Duration,
    /// CPU time of the worker's thread, summed over blocks.
    pub cpu: Duration,
}

/// A finished (or stopped) execution's figures.
#[derive(Clone, Debug, Default)]
pub struct DatasetStats {
    /// Per operator, in plan order: the read first, then the operators,
    /// the encoding and the store.
    pub operators: Vec<OperatorStats>,
    /// Blocks delivered to the consumer.
    pub blocks: u64,
    /// Rows delivered to the consumer.
    pub rows: u64,
    /// The memory budget (bytes of blocks stored and not yet consumed,
    /// plus those being made).
    pub budget_bytes: u64,
    /// The most bytes of blocks stored and not yet consumed at once.
    pub peak_resident_bytes: u64,
    /// Time a block worker sat idle because the budget was spent
    /// (backpressure from a slow consumer).
    pub backpressure: Duration,
    /// Time the consumer waited for a block.
    pub consumer_wait: Duration,
    /// Blocks run again after their worker was lost.
    pub retried_blocks: u64,
    /// Block workers started (replacements included).
    pub workers_started: u64,
    /// Time the block workers took to start (the first spawns, all at
    /// once).
    pub startup: Duration,
    /// Bytes spilled to disk (never: spilling is not enabled).
    pub spilled_bytes: u64,
}

impl DatasetStats {
    /// Adds one block's steps under `names` (the read, each operator, the
    /// store).
    pub(crate) fn add_block(&mut self, names: &[String], steps: &[StepTime]) {
        if self.operators.is_empty() {
            self.operators = names
                .iter()
                .map(|name| OperatorStats {
                    name: name.clone(),
                    ..Default::default()
                })
                .collect();
        }
        for (operator, step) in self.operators.iter_mut().zip(steps) {
            operator.blocks += 1;
            operator.rows += step.rows;
            operator.bytes += step.bytes;
            operator.wall += step.wall;
            operator.cpu += step.cpu;
        }
    }
}

impl fmt::Display for DatasetStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for op in &self.operators {
            writeln!(
                f,
                "{}: {} blocks, {} rows, {:.1} MB out, wall {:.2?}, cpu {:.2?}",
                op.name,
                op.blocks,
                op.rows,
                op.bytes as f64 / 1e6,
                op.wall,
                op.cpu
            )?;
        }
        write!(
            f,
            "consumer: {} blocks, {} rows, waited {:.2?} (workers started in {:.2?}); memory budget {:.1} MB, peak resident {:.1} MB, workers held back {:.2?}, {} blocks retried, {} workers started, {} bytes spilled",
            self.blocks,
            self.rows,
            self.consumer_wait,
            self.startup,
            self.budget_bytes as f64 / 1e6,
            self.peak_resident_bytes as f64 / 1e6,
            self.backpressure,
            self.retried_blocks,
            self.workers_started,
            self.spilled_bytes
        )
    }
}

/// CPU time of the calling thread so far.
pub(crate) fn thread_cpu() -> Duration {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, owned here.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) } == 0;
    if !ok {
        return Duration::ZERO;
    }
    Duration::new(time.tv_sec as u64, time.tv_nsec as u32)
}
