//! The streaming executor: runs a dataset's plan on a pool of block
//! workers and hands its blocks to the consumer in split order, within a
//! memory budget (the decisions are `state.rs`'s; this is their shell).
//!
//! 1. **Start**: spawn `concurrency` [`BlockWorker`] actors (one worker
//!    process each, holding `num_cpus`), all at once.
//! 2. **Make**: whenever the consumer asks for a block, first start every
//!    split the budget allows, at most [`SPLITS_PER_WORKER`] per worker
//!    (the second waits in its mailbox, so a worker never idles between
//!    two), each a [`MakeBlock`] call carrying the split and the
//!    operators.
//! 3. **Hand out**: the next block in split order, once made: its bytes
//!    are mapped from the object store and decoded in place.
//! 4. **Loss**: a worker that dies (or whose node is lost) is replaced and
//!    the splits it was making run again, each up to `max_block_retries`
//!    times; a block whose stored bytes are lost runs again too. An error
//!    of the user's function or of a file fails the dataset at once,
//!    naming both.
//! 5. **End**: when the stream ends or is dropped, the workers are killed
//!    and the blocks not yet consumed are released.

mod state;

use std::collections::HashMap;
use std::time::Instant;

use arrow_array::RecordBatch;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use nimbus::actor::{self, ActorHandle, CallError, SpawnOptions};
use nimbus::object_store;

use crate::error::{BlockError, DataError};
use crate::plan::{Op, Split};
use crate::stats::DatasetStats;
use crate::worker::{BlockWorker, MadeBlock, MakeBlock};

use state::Schedule;

/// Splits sent to one worker before the first of them is made.
pub const SPLITS_PER_WORKER: usize = 2;

/// How the executor runs a plan.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Settings {
    pub(crate) concurrency: usize,
    pub(crate) num_cpus: f64,
    pub(crate) budget: u64,
    pub(crate) max_block_retries: u32,
}

/// A block made, in split order, not yet read: what a split coordinator
/// deals to its consumers.
pub(crate) struct Made {
    pub(crate) index: usize,
    pub(crate) block: MadeBlock,
}

/// One block handed to the consumer.
pub(crate) struct Delivered {
    pub(crate) batch: RecordBatch,
    pub(crate) bytes: u64,
}

type Reply = (
    usize,
    u64,
    usize,
    Result<Result<MadeBlock, BlockError>, CallError>,
);

/// A worker slot: its actor, its splits in flight, its incarnation (a
/// replacement counts up, so that two losses reported by one dead worker
/// replace it once).
struct Slot {
    worker: ActorHandle<BlockWorker>,
    in_flight: usize,
    generation: u64,
}

/// A running execution of one plan.
pub(crate) struct Execution {
    splits: Vec<Split>,
    ops: Vec<Op>,
    names: Vec<String>,
    settings: Settings,
    schedule: Schedule,
    slots: Vec<Slot>,
    replies: FuturesUnordered<BoxFuture<'static, Reply>>,
    made: HashMap<usize, MadeBlock>,
    attempts: HashMap<usize, u32>,
    stats: DatasetStats,
}

impl Execution {
    /// Starts the workers (step 1) for `splits` through `ops`.
    pub(crate) async fn start(
        splits: Vec<Split>,
        ops: Vec<Op>,
        read_name: &str,
        settings: Settings,
    ) -> Result<Self, DataError> {
        let mut names = vec![read_name.to_string()];
        names.extend(ops.iter().map(Op::name));
        names.push("encode".into());
        names.push("store".into());
        let concurrency = settings.concurrency.clamp(1, splits.len().max(1));
        let options = SpawnOptions::default().num_cpus(settings.num_cpus);
        let started = Instant::now();
        let spawned = futures::future::join_all(
            (0..concurrency).map(|_| actor::spawn::<BlockWorker>((), options.clone())),
        )
        .await;
        let mut slots = Vec::new();
        let mut failed = None;
        for worker in spawned {
            match worker {
                Ok(worker) => slots.push(Slot {
                    worker,
                    in_flight: 0,
                    generation: 0,
                }),
                Err(e) => failed = Some(e),
            }
        }
        let stats = DatasetStats {
            budget_bytes: settings.budget,
            workers_started: slots.len() as u64,
            startup: started.elapsed(),
            ..Default::default()
        };
        let execution = Execution {
            schedule: Schedule::new(splits.len(), settings.budget),
            splits,
            ops,
            names,
            settings,
            slots,
            replies: FuturesUnordered::new(),
            made: HashMap::new(),
            attempts: HashMap::new(),
            stats,
        };
        match failed {
            Some(e) => Err(DataError::Spawn(e)),
            None => Ok(execution),
        }
    }

    /// The next block in split order, read, `None` after the last (steps
    /// 2-4).
    pub(crate) async fn next_block(&mut self) -> Option<Result<Delivered, DataError>> {
        loop {
            let made = match self.next_made().await? {
                Ok(made) => made,
                Err(e) => return Some(Err(e)),
            };
            match self.fetch(made).await {
                Ok(Some(delivered)) => return Some(Ok(delivered)),
                Ok(None) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// The next block in split order, made but not read, `None` after the
    /// last (steps 2 and 4).
    pub(crate) async fn next_made(&mut self) -> Option<Result<Made, DataError>> {
        loop {
            self.start_splits();
            if let Some(index) = self.schedule.hand_out() {
                return match self.made.remove(&index) {
                    Some(block) => Some(Ok(Made { index, block })),
                    None => Some(Err(DataError::Arrow {
                        what: "the executor",
                        detail: format!("block {index} was handed out but not made (a bug)"),
                    })),
                };
            }
            if self.schedule.finished() {
                return None;
            }
            let waited = Instant::now();
            let reply = self.replies.next().await;
            self.stats.consumer_wait += waited.elapsed();
            let Some((slot, generation, index, reply)) = reply else {
                return Some(Err(DataError::Arrow {
                    what: "the executor",
                    detail: "no block is being made and none is ready (a bug)".into(),
                }));
            };
            if let Some(slot) = self.slots.get_mut(slot) {
                if slot.generation == generation {
                    slot.in_flight = slot.in_flight.saturating_sub(1);
                }
            }
            match reply {
                Ok(Ok(made)) => {
                    self.stats.add_block(&self.names, &made.steps);
                    self.schedule.made(index, made.bytes);
                    self.made.insert(index, made);
                }
                Ok(Err(failure)) => return Some(Err(DataError::Block(failure))),
                Err(lost) => {
                    if let Err(e) = self
                        .lost(slot, generation, index, lost.to_string(), true)
                        .await
                    {
                        return Some(Err(e));
                    }
                }
            }
        }
    }

    /// Starts every split the schedule allows on workers with room.
    fn start_splits(&mut self) {
        loop {
            let Some(slot) = (0..self.slots.len())
                .filter(|s| self.slots[*s].in_flight < SPLITS_PER_WORKER)
                .min_by_key(|s| self.slots[*s].in_flight)
            else {
                return;
            };
            let Some(index) = self.schedule.start(Instant::now()) else {
                return;
            };
            let target = &mut self.slots[slot];
            target.in_flight += 1;
            let generation = target.generation;
            let call = target.worker.send(MakeBlock {
                split: self.splits[index].clone(),
                ops: self.ops.clone(),
            });
            self.replies.push(
                call.map(move |reply| (slot, generation, index, reply))
                    .boxed(),
            );
        }
    }

    /// Maps and decodes a made block (step 3); `None` when its bytes were
    /// lost and it runs again.
    async fn fetch(
        &mut self,
        Made { index, block: made }: Made,
    ) -> Result<Option<Delivered>, DataError> {
        let bytes = match object_store::get_bytes(&made.object).await {
            Ok(bytes) => bytes,
            Err(e) => {
                self.schedule.lost_handed_out(index, made.bytes);
                self.retry(index, format!("its stored block was lost: {e}"))?;
                return Ok(None);
            }
        };
        let batch = crate::block::decode(bytes, index)?;
        self.stats.blocks += 1;
        self.stats.rows += batch.num_rows() as u64;
        Ok(Some(Delivered {
            batch,
            bytes: made.bytes,
        }))
    }

    /// The consumer is done with a block of `bytes`.
    pub(crate) fn consumed(&mut self, bytes: u64) {
        self.schedule.consumed(bytes, Instant::now());
    }

    /// Counts `rows` of a block delivered to a consumer elsewhere (a
    /// split's).
    pub(crate) fn delivered(&mut self, rows: u64) {
        self.stats.blocks += 1;
        self.stats.rows += rows;
    }

    /// Counts another attempt at split `index`; fails past the retries.
    fn retry(&mut self, index: usize, why: String) -> Result<(), DataError> {
        let attempts = self.attempts.entry(index).or_insert(1);
        *attempts += 1;
        self.stats.retried_blocks += 1;
        if *attempts > self.settings.max_block_retries + 1 {
            return Err(DataError::WorkerLost {
                block: index,
                source_name: self.splits[index].describe(),
                attempts: *attempts - 1,
                last: why,
            });
        }
        tracing::warn!(block = index, source = %self.splits[index].describe(), "block runs again: {why}");
        Ok(())
    }

    /// Split `index` was lost with the worker of `slot` (step 4): replaces
    /// that worker (once per incarnation) and runs the split again.
    async fn lost(
        &mut self,
        slot: usize,
        generation: u64,
        index: usize,
        why: String,
        was_making: bool,
    ) -> Result<(), DataError> {
        self.schedule.lost(index, was_making);
        self.retry(index, why)?;
        let current = self.slots.get(slot).map(|s| s.generation);
        if current == Some(generation) {
            let options = SpawnOptions::default().num_cpus(self.settings.num_cpus);
            let worker = actor::spawn::<BlockWorker>((), options).await?;
            let old = std::mem::replace(
                &mut self.slots[slot],
                Slot {
                    worker,
                    in_flight: 0,
                    generation: generation + 1,
                },
            );
            kill(old.worker);
            self.stats.workers_started += 1;
        }
        Ok(())
    }

    /// The figures so far.
    pub(crate) fn stats(&self) -> DatasetStats {
        let mut stats = self.stats.clone();
        stats.peak_resident_bytes = self.schedule.peak();
        stats.backpressure = self.schedule.backpressure();
        stats
    }
}

impl Drop for Execution {
    /// Step 5: the workers are killed; the blocks not consumed are released
    /// with their references.
    fn drop(&mut self) {
        for slot in self.slots.drain(..) {
            kill(slot.worker);
        }
    }
}

/// Kills `worker` in the background (nothing to wait for: its process
/// goes, and a failure to reach it means it is gone already).
fn kill(worker: ActorHandle<BlockWorker>) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = worker.kill().await;
        });
    }
}
