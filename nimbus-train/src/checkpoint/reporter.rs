//! The `CheckpointReporter` actor: the driver-side record of a run's saved
//! checkpoints. Rank 0 writes each checkpoint itself (atomically, off the
//! training thread) and the supervisor tells this actor once it is complete;
//! the reporter keeps the `num_to_keep` best (by `score_attribute` in
//! `score_order`, or the newest) and always the latest (restarts resume
//! from it), deletes the rest, and answers which checkpoint a restart
//! resumes from (`Latest`: the newest one that still verifies, corrupt
//! ones dropped) and which are the best (`Best`).

use std::path::PathBuf;

use actix::prelude::*;
use serde::{Deserialize, Serialize};

use super::verify;
use crate::{CheckpointConfig, Metrics, ScoreOrder};

/// A complete checkpoint on disk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedCheckpoint {
    /// Its directory.
    pub path: PathBuf,
    /// The report index it was saved with.
    pub index: u64,
    /// The metrics reported with it.
    pub metrics: Metrics,
}

/// Keeps track of a run's checkpoints.
pub struct CheckpointReporter {
    config: CheckpointConfig,
    saved: Vec<SavedCheckpoint>,
}

impl CheckpointReporter {
    /// A reporter applying `config`'s retention.
    pub fn new(config: CheckpointConfig) -> Self {
        CheckpointReporter {
            config,
            saved: Vec::new(),
        }
    }

    fn score(&self, checkpoint: &SavedCheckpoint) -> Option<f64> {
        let attribute = self.config.score_attribute.as_ref()?;
        checkpoint.metrics.get(attribute).copied()
    }

    /// Best first: by score when there is one (unscored last), else newest.
    fn ranked(&self) -> Vec<SavedCheckpoint> {
        let mut ranked = self.saved.clone();
        ranked.sort_by(|a, b| {
            let by_index = b.index.cmp(&a.index);
            if self.config.score_attribute.is_none() {
                return by_index;
            }
            match (self.score(a), self.score(b)) {
                (Some(x), Some(y)) => {
                    let order = match self.config.score_order {
                        ScoreOrder::Max => y.total_cmp(&x),
                        ScoreOrder::Min => x.total_cmp(&y),
                    };
                    order.then(by_index)
                }
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => by_index,
            }
        });
        ranked
    }

    fn retain(&mut self) {
        let Some(keep) = self.config.num_to_keep else {
            return;
        };
        let latest = self.saved.iter().map(|c| c.index).max();
        let kept: Vec<u64> = self.ranked().iter().take(keep).map(|c| c.index).collect();
        let (stay, go): (Vec<_>, Vec<_>) = self
            .saved
            .drain(..)
            // The latest stays whatever its score: restarts resume from it.
            .partition(|c| kept.contains(&c.index) || Some(c.index) == latest);
        self.saved = stay;
        for checkpoint in go {
            if let Err(e) = std::fs::remove_dir_all(&checkpoint.path) {
                tracing::warn!(path = %checkpoint.path.display(), "cannot delete checkpoint: {e}");
            }
        }
    }
}

impl Actor for CheckpointReporter {
    type Context = Context<Self>;
}

/// A checkpoint is complete on disk.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Saved(pub SavedCheckpoint);

impl Handler<Saved> for CheckpointReporter {
    type Result = ();

    fn handle(&mut self, Saved(checkpoint): Saved, _: &mut Context<Self>) {
        self.saved.retain(|c| c.index != checkpoint.index);
        self.saved.push(checkpoint);
        self.saved.sort_by_key(|c| c.index);
        self.retain();
    }
}

/// The newest checkpoint that verifies; checkpoints newer than it that do
/// not are dropped (with their reasons in the reply).
#[derive(Message)]
#[rtype(result = "LatestReply")]
pub struct Latest;

/// The reply to [`Latest`].
#[derive(Debug, Default)]
pub struct LatestReply {
    /// The checkpoint to resume from.
    pub checkpoint: Option<SavedCheckpoint>,
    /// Checkpoints that failed verification, newest first, with why.
    pub skipped: Vec<String>,
}

impl Handler<Latest> for CheckpointReporter {
    type Result = MessageResult<Latest>;

    fn handle(&mut self, _: Latest, _: &mut Context<Self>) -> Self::Result {
        let mut reply = LatestReply::default();
        while let Some(newest) = self.saved.last() {
            match verify(&newest.path) {
                Ok(_) => {
                    reply.checkpoint = Some(newest.clone());
                    break;
                }
                Err(e) => {
                    tracing::warn!("skipping checkpoint: {e}");
                    reply.skipped.push(e.to_string());
                    self.saved.pop();
                }
            }
        }
        MessageResult(reply)
    }
}

/// The kept checkpoints, best first.
#[derive(Message)]
#[rtype(result = "Vec<SavedCheckpoint>")]
pub struct Best;

impl Handler<Best> for CheckpointReporter {
    type Result = MessageResult<Best>;

    fn handle(&mut self, _: Best, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.ranked())
    }
}
