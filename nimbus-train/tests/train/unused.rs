//! Parameters one rank does not use, and bf16 parameters: every rank
//! still averages every gradient, so replicas stay identical.

use nimbus_train::tch::nn::{self, Module};
use nimbus_train::tch::{Device, Kind, Tensor};
use nimbus_train::{LoopResult, RunConfig, ScalingConfig, Sgd, TrainContext, TrainLoop, Trainer};
use serde::{Deserialize, Serialize};

use crate::tests::storage;

/// A shared layer, then a head only rank 0 uses and one only the others
/// use; checks after every step that each replica equals rank 0's.
pub struct OneHeadPerRank;

/// Steps to take, and whether the parameters are bf16.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OneHeadPerRankConfig {
    steps: u64,
    bf16: bool,
}

impl TrainLoop for OneHeadPerRank {
    const NAME: &'static str = "tests.OneHeadPerRank";
    type Config = OneHeadPerRankConfig;

    fn run(config: OneHeadPerRankConfig, ctx: &mut TrainContext) -> LoopResult {
        nimbus_train::tch::manual_seed(3);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let shared = nn::linear(vs.root() / "shared", 4, 4, Default::default());
        let head0 = nn::linear(vs.root() / "head0", 4, 1, Default::default());
        let head1 = nn::linear(vs.root() / "head1", 4, 1, Default::default());
        let kind = if config.bf16 {
            vs.bfloat16();
            Kind::BFloat16
        } else {
            Kind::Float
        };
        let model = ctx.prepare_model(&vs)?;
        let mut sgd = Sgd::new(&model, 0.1, 0.9);
        let rank = ctx.world_rank();
        for step in 1..=config.steps {
            let x = Tensor::ones([2, 4], (kind, Device::Cpu)) * (rank + step as usize) as f64;
            let hidden = shared.forward(&x);
            let head = if rank == 0 { &head0 } else { &head1 };
            let loss = head.forward(&hidden).pow_tensor_scalar(2).mean(Kind::Float);
            sgd.zero_grad();
            loss.backward();
            ctx.sync_gradients(&model)?;
            sgd.step();
            let mut mine = Vec::new();
            for (_, tensor) in model.parameters() {
                let values = tensor.detach().to_kind(Kind::Float).flatten(0, -1);
                mine.extend(Vec::<f32>::try_from(values)?);
            }
            let mut rank0 = mine.clone();
            ctx.collective().broadcast(&mut rank0, 0)?;
            if mine
                .iter()
                .zip(&rank0)
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                return Err(format!("rank {rank} diverged from rank 0 after step {step}").into());
            }
            let metrics = nimbus_train::Metrics::from([("step".to_string(), step as f64)]);
            ctx.report(metrics, None)?;
        }
        Ok(())
    }
}

pub async fn a_parameter_one_rank_does_not_use_keeps_replicas_identical(_: &mut nimbus::Driver) {
    run_heads("one-head-per-rank", false).await;
}

pub async fn bf16_parameters_are_averaged_and_replicas_stay_identical(_: &mut nimbus::Driver) {
    run_heads("one-head-per-rank-bf16", true).await;
}

async fn run_heads(name: &str, bf16: bool) {
    let run = RunConfig::new(name, storage())
        .collective_timeout(std::time::Duration::from_secs(20))
        .placement_timeout(std::time::Duration::from_secs(20));
    let result = Trainer::<OneHeadPerRank>::new(
        OneHeadPerRankConfig { steps: 4, bf16 },
        ScalingConfig::workers(2),
        run,
    )
    .fit()
    .await;
    if let Some(error) = &result.error {
        panic!("training failed: {error}");
    }
    assert_eq!(result.metrics_history.len(), 4, "{result:?}");
}
