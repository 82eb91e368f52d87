//! `SplitCoordinator`: the actor behind a `streaming_split`, in a worker
//! process of its own. It runs the dataset's executor and deals its blocks
//! to the consumers through the `Dealer` (`dealer.rs`), which decides.
//!
//! 1. A consumer asks for its next slice ([`NextSlice`]); its request also
//!    counts its previous slice consumed, and a block consumed by every
//!    consumer leaves the executor's memory budget.
//! 2. When the dealer says `Pull`, the asking consumer's request pulls the
//!    next block from the executor (the executor starts on the first
//!    pull); on `Wait`, it waits for another consumer to take a slice,
//!    looking again every [`RECHECK`].
//! 3. Consumers' streams send [`Alive`] every `HEARTBEAT`, recorded apart
//!    from the dealer so that a long pull delays nobody's heartbeat; a
//!    stream dropped sends [`Leave`].
//! 4. The coordinator stops once every consumer has ended or left (its
//!    worker process exits); its executor's workers are killed first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use nimbus::object_store::{ObjectRef, RawBytes};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::dealer::{Deal, Dealer};
use crate::executor::{Execution, Settings};
use crate::plan::{Op, Split};

/// How often a consumer waiting for the others looks again.
pub const RECHECK: Duration = Duration::from_millis(100);

/// What a coordinator runs and deals.
#[derive(Clone, Serialize, Deserialize)]
pub struct SplitPlan {
    pub(crate) splits: Vec<Split>,
    pub(crate) ops: Vec<Op>,
    pub(crate) read_name: String,
    pub(crate) settings: Settings,
    pub(crate) n: usize,
    pub(crate) equal: bool,
}

/// Deals a dataset's blocks to `n` consumers.
pub struct SplitCoordinator {
    shared: Arc<tokio::sync::Mutex<Shared>>,
    heard: Arc<Mutex<HashMap<usize, Instant>>>,
    taken: Arc<Notify>,
}

struct Shared {
    plan: SplitPlan,
    execution: Option<Execution>,
    dealer: Dealer,
    /// Blocks being dealt: their objects and sizes.
    blocks: HashMap<usize, (ObjectRef<RawBytes>, u64)>,
    failed: Option<String>,
}

impl Actor for SplitCoordinator {
    type Context = Context<Self>;
}

nimbus::remote_actor!(
    SplitCoordinator,
    args: SplitPlan,
    new: |plan: SplitPlan| SplitCoordinator {
        shared: Arc::new(tokio::sync::Mutex::new(Shared {
            dealer: Dealer::new(plan.n, plan.equal, Instant::now()),
            plan,
            execution: None,
            blocks: HashMap::new(),
            failed: None,
        })),
        heard: Arc::new(Mutex::new(HashMap::new())),
        taken: Arc::new(Notify::new()),
    },
    handles: [NextSlice, Alive, Leave]
);

/// Consumer `split`'s next slice (step 1): `None` at the end of its share.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Option<SliceRef>, String>")]
pub struct NextSlice {
    pub(crate) split: usize,
}

/// Consumer `split` is alive (step 3).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Alive {
    pub(crate) split: usize,
}

/// Consumer `split` stopped (step 3): at its end or before.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Leave {
    pub(crate) split: usize,
    pub(crate) at_end: bool,
}

nimbus::remote_message!(NextSlice, Alive, Leave);

/// Rows `offset..offset + rows` of a block's object.
#[derive(Serialize, Deserialize)]
pub struct SliceRef {
    pub(crate) object: ObjectRef<RawBytes>,
    pub(crate) block: usize,
    pub(crate) offset: u64,
    pub(crate) rows: u64,
}

impl Handler<NextSlice> for SplitCoordinator {
    type Result = ResponseFuture<Result<Option<SliceRef>, String>>;

    fn handle(&mut self, m: NextSlice, _: &mut Context<Self>) -> Self::Result {
        let (shared, heard, taken) = (self.shared.clone(), self.heard.clone(), self.taken.clone());
        Box::pin(async move {
            loop {
                let mut guard = shared.lock().await;
                let state = &mut *guard;
                if m.split >= state.plan.n {
                    return Err(format!("no split {} (there are {})", m.split, state.plan.n));
                }
                if let Some(failed) = &state.failed {
                    return Err(failed.clone());
                }
                let heard_now: Vec<(usize, Instant)> = heard
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|(s, t)| (*s, *t))
                    .collect();
                for (split, at) in heard_now {
                    state.dealer.heard(split, at);
                }
                let (deal, consumed) = state.dealer.next(m.split, Instant::now());
                state.release(consumed);
                match deal {
                    Deal::Slice(slice) => {
                        taken.notify_waiters();
                        let Some((object, _)) = state.blocks.get(&slice.block) else {
                            return Err(format!(
                                "block {} dealt but not held (a bug)",
                                slice.block
                            ));
                        };
                        return Ok(Some(SliceRef {
                            object: object.clone(),
                            block: slice.block,
                            offset: slice.offset,
                            rows: slice.rows,
                        }));
                    }
                    Deal::End => return Ok(None),
                    Deal::Gone { split, why } => {
                        // Nobody will read the rest: the workers go now.
                        state.execution = None;
                        state.blocks.clear();
                        return Err(format!("split {split} of {}: {why}", state.plan.n));
                    }
                    Deal::Wait => {
                        drop(guard);
                        let _ = tokio::time::timeout(RECHECK, taken.notified()).await;
                    }
                    Deal::Pull => {
                        if let Err(e) = state.pull().await {
                            state.failed = Some(e.clone());
                            return Err(e);
                        }
                        taken.notify_waiters();
                    }
                }
            }
        })
    }
}

impl Shared {
    /// Pulls the next block from the executor, started at the first pull
    /// (step 2).
    async fn pull(&mut self) -> Result<(), String> {
        if self.execution.is_none() {
            let plan = &self.plan;
            let execution = Execution::start(
                plan.splits.clone(),
                plan.ops.clone(),
                &plan.read_name,
                plan.settings.clone(),
            )
            .await
            .map_err(|e| e.to_string())?;
            self.execution = Some(execution);
        }
        let Some(execution) = self.execution.as_mut() else {
            return Err("the executor did not start".into());
        };
        match execution.next_made().await {
            Some(Ok(made)) => {
                execution.delivered(made.block.rows);
                self.dealer.add_block(made.index, made.block.rows);
                self.blocks
                    .insert(made.index, (made.block.object, made.block.bytes));
                Ok(())
            }
            Some(Err(e)) => Err(e.to_string()),
            None => {
                let consumed = self.dealer.exhausted();
                self.release(consumed);
                let dropped = self.dealer.dropped_rows();
                if dropped > 0 {
                    tracing::info!(
                        "streaming_split({}, equal): the last {dropped} rows dropped to keep the splits equal",
                        self.plan.n
                    );
                }
                Ok(())
            }
        }
    }

    /// Blocks every consumer is done with leave the budget (step 1).
    fn release(&mut self, consumed: Vec<usize>) {
        for block in consumed {
            if let Some((_, bytes)) = self.blocks.remove(&block) {
                if let Some(execution) = self.execution.as_mut() {
                    execution.consumed(bytes);
                }
            }
        }
    }
}

impl Handler<Alive> for SplitCoordinator {
    type Result = ();

    fn handle(&mut self, m: Alive, _: &mut Context<Self>) {
        self.heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(m.split, Instant::now());
    }
}

impl Handler<Leave> for SplitCoordinator {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, m: Leave, _: &mut Context<Self>) -> Self::Result {
        let (shared, taken) = (self.shared.clone(), self.taken.clone());
        let left = async move {
            let mut state = shared.lock().await;
            state.dealer.left(m.split, m.at_end);
            taken.notify_waiters();
            let all_ended = state.dealer.all_ended();
            if all_ended {
                // Step 4: the executor's workers are killed now.
                state.execution = None;
                state.blocks.clear();
            }
            all_ended
        };
        Box::pin(left.into_actor(self).map(|all_ended, _, ctx| {
            if all_ended {
                ctx.stop();
            }
        }))
    }
}
