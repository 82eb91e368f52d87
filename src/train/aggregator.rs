//! The `ParameterAggregator` actor: parameter-server style training, the
//! alternative to allreduce. Workers push to it and pull from it:
//!
//! - **synchronous averaging**: every worker pushes its parameters for round
//!   `r` ([`PushAverage`]); once all `workers` have, each gets the average
//!   (the same bytes for all), and the aggregator keeps it;
//! - **asynchronous updates**: a worker pushes a gradient whenever it has
//!   one ([`PushGradient`]); the aggregator applies `params -= lr·gradient`
//!   at once and answers with the new version and the push's staleness;
//!   workers [`Pull`] the latest parameters when they like.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use nimbus::actor::{spawn, SpawnOptions};
//! use nimbus::train::{Aggregation, AggregatorArgs, ParameterAggregator, Params, Pull, PushGradient};
//! let args = AggregatorArgs { initial: Params::from_f32(&[0.0; 4]), mode: Aggregation::Asynchronous { lr: 0.1 } };
//! let server = spawn::<ParameterAggregator>(args, SpawnOptions::default()).await?;
//! let push = PushGradient { seen_version: 0, gradient: Params::from_f32(&[1.0; 4]) };
//! let update = server.send(push).await?.map_err(anyhow::Error::msg)?;
//! let (version, params) = server.send(Pull).await?;
//! assert_eq!((version, params.to_f32()), (update.version, vec![-0.1; 4]));
//! # Ok(()) }
//! ```

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::actor::{Registry, RemoteActor, RemoteMessage};

/// A flat vector of `f32` parameters (or gradients), sent as little-endian
/// bytes (MessagePack would spend 5 bytes per float otherwise).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Params(#[serde(with = "serde_bytes")] Vec<u8>);

impl Params {
    /// From values.
    pub fn from_f32(values: &[f32]) -> Self {
        Params(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// The values.
    pub fn to_f32(&self) -> Vec<f32> {
        self.0
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.0.len() / 4
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// How pushes are combined.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Aggregation {
    /// Average the parameters of `workers` pushes per round.
    Synchronous {
        /// Pushes per round.
        workers: usize,
    },
    /// Apply each gradient at once with this learning rate.
    Asynchronous {
        /// Learning rate.
        lr: f32,
    },
}

/// The aggregator's constructor arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AggregatorArgs {
    /// The starting parameters.
    pub initial: Params,
    /// How pushes are combined.
    pub mode: Aggregation,
}

/// A parameter aggregator refused a push. It travels back to the pusher
/// over the wire, so it is serializable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AggregatorRefusal {
    /// Parameters pushed to an asynchronous aggregator.
    #[error("this aggregator is asynchronous: push gradients")]
    Asynchronous,
    /// A gradient pushed to a synchronous aggregator.
    #[error("this aggregator is synchronous: push parameters per round")]
    Synchronous,
    /// A push for another round than the current one.
    #[error("push for round {pushed} but the aggregator is at round {current}")]
    WrongRound {
        /// The push's round.
        pushed: u64,
        /// The aggregator's.
        current: u64,
    },
    /// A push of the wrong size.
    #[error("{pushed} values pushed, the aggregator holds {holds} parameters")]
    WrongLength {
        /// Values pushed.
        pushed: usize,
        /// Parameters held.
        holds: usize,
    },
    /// The aggregator stopped before the round completed.
    #[error("the aggregator stopped")]
    Stopped,
}

/// Holds the parameters; see the module docs.
pub struct ParameterAggregator {
    params: Vec<f32>,
    version: u64,
    mode: Aggregation,
    round: u64,
    pushed: Vec<(Vec<f32>, AverageReply)>,
}

/// Where a synchronous push's answer goes once its round completes.
type AverageReply = oneshot::Sender<Result<Params, AggregatorRefusal>>;

impl Actor for ParameterAggregator {
    type Context = Context<Self>;
}

impl RemoteActor for ParameterAggregator {
    const NAME: &'static str = "nimbus.train.ParameterAggregator";
    type Args = AggregatorArgs;
    fn from_args(args: AggregatorArgs) -> Self {
        ParameterAggregator {
            params: args.initial.to_f32(),
            version: 0,
            mode: args.mode,
            round: 0,
            pushed: Vec::new(),
        }
    }
}

impl Registry {
    /// Registers the [`ParameterAggregator`] and its messages.
    pub fn parameter_aggregator(self) -> Self {
        self.actor::<ParameterAggregator>()
            .message::<ParameterAggregator, PushAverage>()
            .message::<ParameterAggregator, PushGradient>()
            .message::<ParameterAggregator, Pull>()
    }
}

/// Synchronous mode: this worker's parameters for `round`; answered with the
/// round's average once every worker has pushed.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Params, AggregatorRefusal>")]
pub struct PushAverage {
    /// The round (0, 1, ...): pushes for any other round than the current
    /// one are refused.
    pub round: u64,
    /// The parameters.
    pub params: Params,
}

impl RemoteMessage for PushAverage {
    const NAME: &'static str = "nimbus.train.PushAverage";
}

impl Handler<PushAverage> for ParameterAggregator {
    type Result = ResponseFuture<Result<Params, AggregatorRefusal>>;

    fn handle(&mut self, push: PushAverage, _: &mut Context<Self>) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        let refused = |e: AggregatorRefusal| -> Self::Result { Box::pin(async move { Err(e) }) };
        let Aggregation::Synchronous { workers } = self.mode else {
            return refused(AggregatorRefusal::Asynchronous);
        };
        if push.round != self.round {
            return refused(AggregatorRefusal::WrongRound {
                pushed: push.round,
                current: self.round,
            });
        }
        let values = push.params.to_f32();
        if values.len() != self.params.len() {
            return refused(AggregatorRefusal::WrongLength {
                pushed: values.len(),
                holds: self.params.len(),
            });
        }
        self.pushed.push((values, reply));
        if self.pushed.len() >= workers {
            let pushed = std::mem::take(&mut self.pushed);
            let scale = 1.0 / pushed.len() as f32;
            self.params.iter_mut().for_each(|p| *p = 0.0);
            // Summed in arrival order: one result, sent to every worker.
            for (values, _) in &pushed {
                for (p, v) in self.params.iter_mut().zip(values) {
                    *p += v;
                }
            }
            self.params.iter_mut().for_each(|p| *p *= scale);
            self.round += 1;
            self.version += 1;
            let average = Params::from_f32(&self.params);
            for (_, reply) in pushed {
                let _ = reply.send(Ok(average.clone()));
            }
        }
        Box::pin(async move { answer.await.unwrap_or(Err(AggregatorRefusal::Stopped)) })
    }
}

/// What an asynchronous push did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Update {
    /// The parameters' version after it.
    pub version: u64,
    /// Updates applied since the version the gradient was computed on.
    pub staleness: u64,
}

/// Asynchronous mode: a gradient computed on `seen_version`.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Update, AggregatorRefusal>")]
pub struct PushGradient {
    /// The version of the parameters the gradient was computed on.
    pub seen_version: u64,
    /// The gradient.
    pub gradient: Params,
}

impl RemoteMessage for PushGradient {
    const NAME: &'static str = "nimbus.train.PushGradient";
}

impl Handler<PushGradient> for ParameterAggregator {
    type Result = Result<Update, AggregatorRefusal>;

    fn handle(&mut self, push: PushGradient, _: &mut Context<Self>) -> Self::Result {
        let Aggregation::Asynchronous { lr } = self.mode else {
            return Err(AggregatorRefusal::Synchronous);
        };
        let gradient = push.gradient.to_f32();
        if gradient.len() != self.params.len() {
            return Err(AggregatorRefusal::WrongLength {
                pushed: gradient.len(),
                holds: self.params.len(),
            });
        }
        for (p, g) in self.params.iter_mut().zip(&gradient) {
            *p -= lr * g;
        }
        let staleness = self.version.saturating_sub(push.seen_version);
        self.version += 1;
        Ok(Update {
            version: self.version,
            staleness,
        })
    }
}

/// The current version and parameters.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "(u64, Params)")]
pub struct Pull;

impl RemoteMessage for Pull {
    const NAME: &'static str = "nimbus.train.Pull";
}

impl Handler<Pull> for ParameterAggregator {
    type Result = MessageResult<Pull>;

    fn handle(&mut self, _: Pull, _: &mut Context<Self>) -> Self::Result {
        MessageResult((self.version, Params::from_f32(&self.params)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix::test]
    async fn synchronous_rounds_average_and_asynchronous_pushes_apply() {
        let sync = ParameterAggregator::from_args(AggregatorArgs {
            initial: Params::from_f32(&[0.0, 0.0]),
            mode: Aggregation::Synchronous { workers: 2 },
        })
        .start();
        let a = sync.send(PushAverage {
            round: 0,
            params: Params::from_f32(&[1.0, 2.0]),
        });
        let b = sync.send(PushAverage {
            round: 0,
            params: Params::from_f32(&[3.0, 4.0]),
        });
        let (a, b) = futures::join!(a, b);
        assert_eq!(a.unwrap().unwrap().to_f32(), vec![2.0, 3.0]);
        assert_eq!(b.unwrap().unwrap().to_f32(), vec![2.0, 3.0]);
        let stale = sync
            .send(PushAverage {
                round: 0,
                params: Params::from_f32(&[1.0, 1.0]),
            })
            .await
            .unwrap();
        assert_eq!(
            stale.unwrap_err(),
            AggregatorRefusal::WrongRound {
                pushed: 0,
                current: 1
            }
        );

        let server = ParameterAggregator::from_args(AggregatorArgs {
            initial: Params::from_f32(&[1.0]),
            mode: Aggregation::Asynchronous { lr: 0.5 },
        })
        .start();
        let push = |seen_version| PushGradient {
            seen_version,
            gradient: Params::from_f32(&[1.0]),
        };
        let first = server.send(push(0)).await.unwrap().unwrap();
        let second = server.send(push(0)).await.unwrap().unwrap();
        assert_eq!((first.version, first.staleness), (1, 0));
        assert_eq!((second.version, second.staleness), (2, 1));
        let (version, params) = server.send(Pull).await.unwrap();
        assert_eq!((version, params.to_f32()), (2, vec![0.0]));
    }
}
