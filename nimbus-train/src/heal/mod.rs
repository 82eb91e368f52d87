//! Peer heal: when a worker dies, the survivors keep their state and go on
//! from the step they are at; a replacement gets the complete training
//! state from a live peer, so no step is redone (the checkpoint restart,
//! `supervisor/mod.rs`, remains for what a heal cannot mend).
//!
//! The protocol:
//! 1. A worker of the running attempt dies (its process is gone: the head
//!    recorded its death). The supervisor heals instead of restarting when
//!    the run allows it (`RunConfig::peer_heal`, on by default), the group
//!    is on one host (the shared-memory collective), every survivor's loop
//!    heals (it calls `TrainContext::sync_gradients_or_heal`), no rank has
//!    finished, and failures are left (`max_failures`: a heal counts as
//!    one). The lowest surviving rank is the source (`supervisor/policy.rs`).
//! 2. The supervisor names a new group (a new segment, the same ranks),
//!    sends `HealGroup(HealOrder)` to every survivor and spawns a
//!    replacement `TrainerWorker` into each dead rank's bundle, started
//!    with an assignment that carries [`HealFrom`] (`supervisor/heal.rs`).
//! 3. A survivor's worker queues the order, then aborts the current group:
//!    the survivor, blocked in the step's allreduce (its peer is gone),
//!    sees it fail, takes the newest order (waiting up to `ORDER_WAIT`, 5 s:
//!    a peer's abort can come first) and joins the new group.
//! 4. Every rank of the new group exchanges the state (`state.rs`): the
//!    source's loop makes it (`state()`: a checkpoint to resume the current
//!    step from) and broadcasts it with its report count; each tensor's
//!    SHA-256 is checked.
//! 5. A survivor checks that the source has made as many reports as it has
//!    (they are at one step), then runs the step's allreduce again with its
//!    gradients, which the failed one left untouched. A replacement runs
//!    the loop with the state as `ctx.checkpoint()` and the source's report
//!    count; its `prepare_model` does not broadcast (the state is the
//!    group's already). It computes the dead rank's gradients for the step
//!    and joins that allreduce: the step's result is the fault-free one.
//! 6. The heal is over when every replaced rank has reported
//!    (`TrainEvent::Healed`, with the time since the death).
//! 7. A death during a heal (a survivor, the source mid-transfer, a
//!    replacement): the heal starts again with every rank lost so far, the
//!    failed heal's replacements killed and spawned anew; with no survivor
//!    left, or a failure that is not a death, the attempt fails and the
//!    group restarts from its checkpoint as before.

pub(crate) mod state;

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::collective::Collective;
use crate::progress::Progress;
use crate::worker::GroupSpec;
use crate::TrainError;

/// How long a survivor whose collective failed waits for a heal order
/// before failing as it would without one.
pub(crate) const ORDER_WAIT: Duration = Duration::from_secs(5);

/// What a survivor is told: the group to join and who sends the state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HealOrder {
    /// The heal's number in its attempt (1 first).
    pub heal: u64,
    /// The new group (same world size and ranks).
    pub group: GroupSpec,
    /// The rank that sends its state.
    pub source: usize,
}

/// What a replacement is told, in its assignment.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HealFrom {
    /// The heal's number in its attempt.
    pub heal: u64,
    /// The rank that sends its state.
    pub source: usize,
}

/// What reaches a survivor's loop thread from its worker actor.
#[derive(Debug)]
pub(crate) enum HealNews {
    /// Heal into this group.
    Order(HealOrder),
    /// The supervisor aborted the loop: no order is coming.
    Abort,
}

/// Why a heal failed on a worker.
#[derive(Debug, thiserror::Error)]
pub enum HealError {
    /// The state could not be encoded.
    #[error("cannot encode the training state: {0}")]
    Encode(String),
    /// What arrived is not a state.
    #[error("the training state that arrived is not one: {0}")]
    Decode(String),
    /// A tensor's bytes changed on the way.
    #[error("tensor {0} of the training state arrived with another SHA-256 than it was sent with")]
    Digest(String),
    /// The new group failed.
    #[error("the heal's group: {0}")]
    Collective(#[from] crate::collective::CollectiveError),
    /// The loop's state could not be made.
    #[error("the loop's state: {0}")]
    State(#[from] crate::checkpoint::CheckpointError),
    /// The source is at another step than this survivor.
    #[error("the source has made {source_reports} reports and this survivor {mine}: they are not at one step")]
    OtherStep {
        /// The source's.
        source_reports: u64,
        /// This survivor's.
        mine: u64,
    },
}

/// Joins a group of this worker's ranks for a heal (and makes it the one
/// an abort reaches); called off once a newer heal is ordered.
pub(crate) type JoinGroup =
    Box<dyn FnMut(&GroupSpec, u64) -> Result<Box<dyn Collective>, TrainError> + Send>;

/// A worker's end of the heal protocol: the orders its actor queues, and
/// how to join the group an order names.
pub(crate) struct HealLink {
    news: Receiver<HealNews>,
    join: JoinGroup,
    progress: Arc<Progress>,
    /// The newest heal this worker has joined.
    joined: u64,
}

impl HealLink {
    pub(crate) fn new(
        news: Receiver<HealNews>,
        join: JoinGroup,
        progress: Arc<Progress>,
        joined: u64,
    ) -> Self {
        HealLink {
            news,
            join,
            progress,
            joined,
        }
    }

    /// Tells the supervisor this worker's loop heals (step 1).
    pub(crate) fn offer(&self) {
        self.progress.set_healable();
    }

    /// Steps 3 to 5 for a survivor at report `reports` whose collective
    /// failed with `failed`: the new group, once the state went through
    /// it. Without an order, `failed`: none is queued, or, after an abort
    /// of the group (the order's, or a peer's that came first), none came
    /// within [`ORDER_WAIT`], or the loop was aborted. A heal that fails
    /// waits for the next order.
    pub(crate) fn survive(
        &mut self,
        rank: usize,
        reports: u64,
        state: &dyn Fn() -> Result<Checkpoint, CheckpointError>,
        mut failed: TrainError,
    ) -> Result<Box<dyn Collective>, TrainError> {
        let mut wait = matches!(failed, TrainError::Aborted(_));
        while let Some(order) = self.next_order(wait) {
            wait = true;
            match self.join_as_survivor(&order, rank, reports, state) {
                Ok(group) => {
                    tracing::info!(
                        heal = order.heal,
                        source = order.source,
                        "rank {rank} healed the group at report {reports}"
                    );
                    return Ok(group);
                }
                Err(e) => {
                    tracing::warn!(heal = order.heal, "rank {rank}: heal failed: {e}");
                    failed = e;
                }
            }
        }
        Err(failed)
    }

    fn join_as_survivor(
        &mut self,
        order: &HealOrder,
        rank: usize,
        reports: u64,
        state: &dyn Fn() -> Result<Checkpoint, CheckpointError>,
    ) -> Result<Box<dyn Collective>, TrainError> {
        self.joined = order.heal;
        let mut group = (self.join)(&order.group, order.heal)?;
        let mine = if rank == order.source {
            Some((state::encode(&state().map_err(HealError::from)?)?, reports))
        } else {
            None
        };
        let peer = state::exchange(group.as_mut(), order.source, mine)?;
        self.progress.step();
        if peer.reports != reports {
            return Err(HealError::OtherStep {
                source_reports: peer.reports,
                mine: reports,
            }
            .into());
        }
        Ok(group)
    }

    /// The newest order for a heal after the last one joined, waiting up
    /// to [`ORDER_WAIT`] for one if `wait`; `None` once the loop is
    /// aborted.
    fn next_order(&mut self, wait: bool) -> Option<HealOrder> {
        let deadline = Instant::now() + if wait { ORDER_WAIT } else { Duration::ZERO };
        let mut newest: Option<HealOrder> = None;
        loop {
            if self.progress.aborted().is_some() {
                return None;
            }
            let news = match newest {
                Some(_) => self.news.try_recv().ok(),
                None => match self
                    .news
                    .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                {
                    Ok(news) => Some(news),
                    Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
                },
            };
            match news {
                Some(HealNews::Abort) => return None,
                Some(HealNews::Order(order)) if order.heal > self.joined => newest = Some(order),
                Some(HealNews::Order(_)) => {}
                None => return newest,
            }
        }
    }
}
