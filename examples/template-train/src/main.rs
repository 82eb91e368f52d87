//! A standalone training program on nimbus: a linear model fitted to
//! y = 3x + 1 by two data-parallel workers.
//!
//! ```text
//! cargo run --release                   # joins the head of `nimbus start --head` on this
//!                                       # machine, else starts a private local cluster
//!                                       # whose nodes run this very program (nothing
//!                                       # else to install)
//! cargo run --release -- --address HOST:PORT --token-file FILE   # any cluster
//! ```
//!
//! Each worker is a worker process of its own, started from this very
//! binary; they average gradients every step. You will see where the
//! run's results went, the last loss, then `summary: workers=2 steps=60 loss=... slope=... restarts=0`.

use nimbus::actor::Registry;
use nimbus_train::tch::{nn, nn::Module, Kind, Tensor};
use nimbus_train::{
    LoopResult, Metrics, RunConfig, ScalingConfig, Sgd, TrainContext, TrainLoop, TrainRegistry,
    Trainer,
};

/// The training loop every worker runs.
struct Fit;

impl TrainLoop for Fit {
    const NAME: &'static str = "template.Fit";
    /// Steps to run.
    type Config = u32;

    fn run(steps: u32, ctx: &mut TrainContext) -> LoopResult {
        let vs = nn::VarStore::new(ctx.device());
        let line = nn::linear(vs.root(), 1, 1, Default::default());
        // Rank 0's initial weights on every worker.
        let model = ctx.prepare_model(&vs)?;
        let mut sgd = Sgd::new(&model, 0.1, 0.0);
        let rank = ctx.world_rank() as f64;
        for _ in 0..steps {
            // Each worker its own slice of x.
            let x = Tensor::linspace(rank, rank + 1.0, 16, (Kind::Float, ctx.device()))
                .reshape([16, 1]);
            let loss = (line.forward(&x) - (&x * 3.0 + 1.0))
                .pow_tensor_scalar(2)
                .mean(None);
            sgd.zero_grad();
            loss.backward();
            ctx.sync_gradients(&model)?;
            sgd.step();
            let slope = line.ws.double_value(&[0, 0]);
            let metrics = Metrics::from([
                ("loss".into(), loss.double_value(&[])),
                ("slope".into(), slope),
            ]);
            ctx.report(metrics, None)?;
        }
        Ok(())
    }
}

fn main() -> anyhow::Result<()> {
    // In a worker process `init` runs the loop it is given, and never
    // returns; here it makes this program a driver.
    let driver = nimbus::init(Registry::new().train_loop::<Fit>())?;
    driver.block_on(async {
        // Checkpoints and results go to storage every worker's node shares
        // (here: this machine's temporary directory), a run of its own.
        let storage = std::env::temp_dir().join("nimbus-template-train");
        let run = format!("fit-{}", std::process::id());
        let steps = 60;
        let result = Trainer::<Fit>::new(
            steps,
            ScalingConfig::workers(2),
            RunConfig::new(run, &storage),
        )
        .fit()
        .await;
        println!("results: {}", result.path.display());
        if let Some(error) = result.error {
            anyhow::bail!("training failed: {error}");
        }
        let last = result.metrics.unwrap_or_default();
        let (loss, slope) = (last.get("loss"), last.get("slope"));
        let (Some(loss), Some(slope)) = (loss, slope) else {
            anyhow::bail!("the run reported no loss and slope");
        };
        println!("loss {loss:.6}");
        println!(
            "summary: workers={} steps={steps} loss={loss:.6} slope={slope:.3} restarts={}",
            result.workers, result.restarts
        );
        Ok(())
    })
}
