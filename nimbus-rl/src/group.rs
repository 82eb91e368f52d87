//! A learner group: `LearnerWorker` actors, one per worker process, each
//! updating a replica of the policy on its share of the rollouts and
//! averaging gradients with the others every minibatch through
//! nimbus-train's shared-memory collective, so every replica applies the
//! same update.
//!
//! 1. Each learner is started with the same state (fresh from the seed, or
//!    restored), then sent `JoinGroup`: it blocks until every rank has
//!    joined the segment (`JOIN_TIMEOUT`).
//! 2. `Update { rollouts, lr }` to every learner: each fetches its share,
//!    updates in lockstep with the others; rank 0 answers with the new
//!    weights, put once in the object store for every runner to read.
//! 3. `GetState` to rank 0: its complete state (weights, Adam's moments,
//!    generator), for `save`.

use std::path::PathBuf;
use std::time::Duration;

use actix::prelude::*;
use nimbus::actor::{RemoteActor, RemoteMessage};
use nimbus::object_store::{self, ObjectRef};
use nimbus_train::collective::{Collective, SharedMemoryGroup};
use nimbus_train::Params;
use serde::{Deserialize, Serialize};

use crate::ppo::{Hyper, Learner, LearnerState, Losses, Rollout};

/// How long a learner waits for the others to join (step 1).
const JOIN_TIMEOUT: Duration = Duration::from_secs(30);
/// The collective's buffer.
const SEGMENT_BYTES: usize = 1 << 20;

/// One learner of the group.
pub(crate) struct LearnerWorker {
    learner: Result<Learner, String>,
    args: LearnerArgs,
    group: Option<SharedMemoryGroup>,
}

/// A [`LearnerWorker`]'s constructor arguments.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LearnerArgs {
    /// The state every learner starts from (the same in all).
    pub(crate) state: LearnerState,
    /// PPO's settings.
    pub(crate) hyper: Hyper,
    /// This learner's rank.
    pub(crate) rank: usize,
    /// Learners in the group.
    pub(crate) world: usize,
    /// The group's shared-memory segment.
    pub(crate) segment: PathBuf,
}

impl Actor for LearnerWorker {
    type Context = Context<Self>;
}

impl RemoteActor for LearnerWorker {
    const NAME: &'static str = "nimbus_rl.LearnerWorker";
    type Args = LearnerArgs;
    fn from_args(args: LearnerArgs) -> Self {
        nimbus_train::tch::set_num_threads(1);
        let mut learner = Learner::new(0, &args.state.net, args.hyper.clone());
        let learner = learner
            .load(&args.state)
            .map(|()| learner)
            .map_err(|e| e.to_string());
        LearnerWorker {
            learner,
            args,
            group: None,
        }
    }
}

/// Form the group (every learner must be sent one; step 1).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub(crate) struct JoinGroup;

impl RemoteMessage for JoinGroup {
    const NAME: &'static str = "nimbus_rl.JoinGroup";
}

impl Handler<JoinGroup> for LearnerWorker {
    type Result = Result<(), String>;
    fn handle(&mut self, _: JoinGroup, _: &mut Context<Self>) -> Self::Result {
        // Blocks this learner's actor thread until every rank has joined:
        // each learner is a process of its own.
        let a = &self.args;
        let group =
            SharedMemoryGroup::join(&a.segment, a.rank, a.world, SEGMENT_BYTES, JOIN_TIMEOUT)
                .map_err(|e| e.to_string())?;
        self.group = Some(group);
        Ok(())
    }
}

/// One PPO update on this learner's rollouts (step 2).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(Losses, Option<ObjectRef<Params>>), String>")]
pub(crate) struct Update {
    /// This learner's share of the iteration's rollouts.
    pub(crate) rollouts: Vec<ObjectRef<Rollout>>,
    /// The learning rate.
    pub(crate) lr: f64,
}

impl RemoteMessage for Update {
    const NAME: &'static str = "nimbus_rl.Update";
}

impl Handler<Update> for LearnerWorker {
    type Result = ResponseActFuture<Self, Result<(Losses, Option<ObjectRef<Params>>), String>>;

    fn handle(&mut self, update: Update, _: &mut Context<Self>) -> Self::Result {
        let lr = update.lr;
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
                    let learner = worker.learner.as_mut().map_err(|e| e.clone())?;
                    let group = worker
                        .group
                        .as_mut()
                        .ok_or("the learner has not joined its group")?;
                    let losses = learner
                        .update(&rollouts, lr, Some(group as &mut dyn Collective))
                        .map_err(|e| e.to_string())?;
                    let weights = (worker.args.rank == 0).then(|| learner.policy.params());
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

/// This learner's complete state (step 3).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<LearnerState, String>")]
pub(crate) struct GetState;

impl RemoteMessage for GetState {
    const NAME: &'static str = "nimbus_rl.GetState";
}

impl Handler<GetState> for LearnerWorker {
    type Result = Result<LearnerState, String>;
    fn handle(&mut self, _: GetState, _: &mut Context<Self>) -> Self::Result {
        let net = self.args.state.net.clone();
        let learner = self.learner.as_ref().map_err(|e| e.clone())?;
        Ok(learner.state(&net))
    }
}
