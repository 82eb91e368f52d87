//! A learner group: `LearnerWorker` actors, one per worker process, each
//! updating a replica of the policy on its share of the rollouts and
//! averaging gradients with the others every minibatch through nimbus's
//! shared-memory collective, so every replica applies the same update. Rank
//! 0 publishes the new weights.

use std::path::PathBuf;
use std::time::Duration;

use actix::prelude::*;
use nimbus::actor::{RemoteActor, RemoteMessage};
use nimbus::object_store::{self, ObjectRef};
use nimbus_train::collective::{Collective, SharedMemoryGroup};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::ppo::{Learner, PpoConfig, Rollout};

/// One learner of the group.
pub struct LearnerWorker {
    learner: Learner,
    rank: usize,
    world: usize,
    segment: PathBuf,
    group: Option<SharedMemoryGroup>,
}

/// A [`LearnerWorker`]'s constructor arguments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LearnerArgs {
    /// Seeds the policy: the same in every learner.
    pub seed: u64,
    /// This learner's rank.
    pub rank: usize,
    /// Learners in the group.
    pub world: usize,
    /// The group's shared-memory segment.
    pub segment: PathBuf,
}

impl Actor for LearnerWorker {
    type Context = Context<Self>;
}

impl RemoteActor for LearnerWorker {
    const NAME: &'static str = "examples.LearnerWorker";
    type Args = LearnerArgs;
    fn from_args(args: LearnerArgs) -> Self {
        nimbus_train::tch::set_num_threads(1);
        let learner = Learner::new(args.seed, PpoConfig::default())
            // A failure here is a programming error in the example: the
            // optimizer is built over a fresh store.
            .unwrap_or_else(|e| panic!("cannot build the learner: {e}"));
        LearnerWorker {
            learner,
            rank: args.rank,
            world: args.world,
            segment: args.segment,
            group: None,
        }
    }
}

/// Form the group (every learner must be sent one).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub struct JoinGroup;

impl RemoteMessage for JoinGroup {
    const NAME: &'static str = "examples.JoinGroup";
}

impl Handler<JoinGroup> for LearnerWorker {
    type Result = Result<(), String>;
    fn handle(&mut self, _: JoinGroup, _: &mut Context<Self>) -> Self::Result {
        // Blocks this learner's actor thread until every rank has joined:
        // each learner is a process of its own.
        let group = SharedMemoryGroup::join(
            &self.segment,
            self.rank,
            self.world,
            1 << 20,
            Duration::from_secs(30),
        )
        .map_err(|e| e.to_string())?;
        self.group = Some(group);
        Ok(())
    }
}

/// The losses of one PPO update on one learner: policy, value, entropy.
pub type Losses = (f64, f64, f64);

/// One PPO update on this learner's rollouts; each learner answers with its
/// losses, rank 0 also with the new weights.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(Losses, Option<ObjectRef<Params>>), String>")]
pub struct Update {
    /// This learner's share of the iteration's rollouts.
    pub rollouts: Vec<ObjectRef<Rollout>>,
    /// Fraction of the training budget spent (anneals the learning rate).
    pub progress: f64,
}

impl RemoteMessage for Update {
    const NAME: &'static str = "examples.Update";
}

impl Handler<Update> for LearnerWorker {
    type Result = ResponseActFuture<Self, Result<(Losses, Option<ObjectRef<Params>>), String>>;

    fn handle(&mut self, update: Update, _: &mut Context<Self>) -> Self::Result {
        let progress = update.progress;
        let fetch = async move {
            let mut rollouts = Vec::new();
            for rollout in &update.rollouts {
                rollouts.push(
                    object_store::get(rollout)
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            Ok::<_, String>(rollouts)
        };
        Box::pin(
            fetch
                .into_actor(self)
                .map(move |rollouts, worker, _| {
                    let rollouts = rollouts?;
                    let group = worker
                        .group
                        .as_mut()
                        .ok_or("the learner has not joined its group")?;
                    let losses = worker
                        .learner
                        .update(&rollouts, progress, Some(group as &mut dyn Collective))
                        .map_err(|e| e.to_string())?;
                    let weights = (worker.rank == 0).then(|| worker.learner.policy.params());
                    Ok((losses, weights))
                })
                .then(
                    |updated: Result<(Losses, Option<Params>), String>, worker, _| {
                        async move {
                            let (losses, weights) = updated?;
                            let published = match weights {
                                Some(weights) => Some(
                                    object_store::put(&weights)
                                        .await
                                        .map_err(|e| e.to_string())?,
                                ),
                                None => None,
                            };
                            Ok((losses, published))
                        }
                        .into_actor(worker)
                    },
                ),
        )
    }
}
