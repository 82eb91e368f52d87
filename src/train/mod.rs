//! What training shares with the rest of nimbus, without libtorch: the
//! training fault rules ([`faults`], which `nimbus chaos` injects), the
//! results a run writes and `nimbus plot` reads ([`results`]), the
//! [`DistributedSampler`] and the [`ParameterAggregator`] (parameter-server
//! training).
//!
//! Training itself (Ray Train's `TorchTrainer`: the supervisor, the workers
//! owning a libtorch model, the collectives, checkpoints) is the
//! `nimbus-train` crate (`nimbus-train/` in this repository), which links
//! libtorch; this crate does not, so the `nimbus` CLI and programs that use
//! actors, tasks and objects only run on machines without it.

mod aggregator;
pub mod faults;
pub mod results;
mod sampler;

pub use aggregator::{
    Aggregation, AggregatorArgs, AggregatorRefusal, ParameterAggregator, Params, Pull, PushAverage,
    PushGradient, Update,
};
pub use sampler::DistributedSampler;
