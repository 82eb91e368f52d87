//! A small GPT-style transformer (token and position embeddings, pre-norm
//! blocks of causal self-attention and a GELU MLP, a final norm and an
//! unbiased head), trained on generated tokens: the model for measuring
//! training throughput on a GPU (`train` bench, part `gpt`).
//! `peers/gpt_eager.py` is the same model and step in PyTorch.
//!
//! Both train in bf16 (parameters, activations and gradients, as
//! `train_mnist --bf16`), not autocast: tch's autocast on CUDA uses
//! PyTorch's default autocast type, f16, and tch 0.24 cannot change it.

use nimbus_train::tch::{nn, Device, Kind, Tensor};
use nimbus_train::{DistributedModel, LoopResult, Metrics, Sgd, TrainContext, TrainLoop};
use serde::{Deserialize, Serialize};

/// The model's shape and the batch.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct GptConfig {
    /// Token ids are below this.
    pub vocab: i64,
    /// Tokens per sequence.
    pub context: i64,
    /// Width of the residual stream.
    pub dim: i64,
    /// Transformer blocks.
    pub layers: i64,
    /// Attention heads (`dim` is a multiple).
    pub heads: i64,
    /// Sequences per step.
    pub batch: i64,
    /// Steps to run.
    pub steps: u64,
    /// Seeds the weights and the tokens.
    pub seed: i64,
}

impl GptConfig {
    /// A GPT-2-small-like shape (12 × 768, 12 heads, 1,024 tokens),
    /// ~100 M parameters with a byte vocabulary: enough to keep one
    /// H200 busy at batch 16.
    pub fn gpu(steps: u64) -> Self {
        GptConfig {
            vocab: 256,
            context: 1024,
            dim: 768,
            layers: 12,
            heads: 12,
            batch: 16,
            steps,
            seed: 0,
        }
    }

    /// A toy shape, for the smoke run on a CPU.
    pub fn tiny(steps: u64) -> Self {
        GptConfig {
            vocab: 64,
            context: 16,
            dim: 32,
            layers: 2,
            heads: 4,
            batch: 2,
            steps,
            seed: 0,
        }
    }

    /// Tokens each step trains on.
    pub fn tokens_per_step(&self) -> i64 {
        self.batch * self.context
    }

    /// Step `step`'s inputs and next-token targets, on `device`.
    fn batch(&self, step: u64, device: Device) -> (Tensor, Tensor) {
        nimbus_train::tch::manual_seed(self.seed + 1 + step as i64);
        let tokens = Tensor::randint(
            self.vocab,
            [self.batch, self.context + 1],
            (Kind::Int64, device),
        );
        (
            tokens.narrow(1, 0, self.context),
            tokens.narrow(1, 1, self.context),
        )
    }
}

struct Block {
    norm1: nn::LayerNorm,
    qkv: nn::Linear,
    project: nn::Linear,
    norm2: nn::LayerNorm,
    up: nn::Linear,
    down: nn::Linear,
    heads: i64,
}

impl Block {
    fn new(root: &nn::Path, dim: i64, heads: i64) -> Self {
        let linear = |name: &str, from, to| nn::linear(root / name, from, to, Default::default());
        Block {
            norm1: nn::layer_norm(root / "norm1", vec![dim], Default::default()),
            qkv: linear("qkv", dim, 3 * dim),
            project: linear("project", dim, dim),
            norm2: nn::layer_norm(root / "norm2", vec![dim], Default::default()),
            up: linear("up", dim, 4 * dim),
            down: linear("down", 4 * dim, dim),
            heads,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (batch, context, dim) = x.size3().unwrap_or((0, 0, 0));
        let qkv = x
            .apply(&self.norm1)
            .apply(&self.qkv)
            .view([batch, context, 3, self.heads, dim / self.heads])
            .permute([2, 0, 3, 1, 4]);
        let attended = Tensor::scaled_dot_product_attention(
            &qkv.get(0),
            &qkv.get(1),
            &qkv.get(2),
            None::<Tensor>,
            0.0,
            true,
            None,
            false,
        )
        .transpose(1, 2)
        .contiguous()
        .view([batch, context, dim]);
        let x = x + attended.apply(&self.project);
        let mlp = x
            .apply(&self.norm2)
            .apply(&self.up)
            .gelu("tanh")
            .apply(&self.down);
        x + mlp
    }
}

/// The transformer.
pub struct Gpt {
    tokens: nn::Embedding,
    positions: nn::Embedding,
    blocks: Vec<Block>,
    norm: nn::LayerNorm,
    head: nn::Linear,
}

impl Gpt {
    /// The model's parameters, under `root`.
    pub fn new(root: &nn::Path, c: &GptConfig) -> Self {
        let blocks = (0..c.layers)
            .map(|i| Block::new(&(root / format!("block{i}")), c.dim, c.heads))
            .collect();
        let unbiased = nn::LinearConfig {
            bias: false,
            ..Default::default()
        };
        Gpt {
            tokens: nn::embedding(root / "tokens", c.vocab, c.dim, Default::default()),
            positions: nn::embedding(root / "positions", c.context, c.dim, Default::default()),
            blocks,
            norm: nn::layer_norm(root / "norm", vec![c.dim], Default::default()),
            head: nn::linear(root / "head", c.dim, c.vocab, unbiased),
        }
    }

    /// Mean next-token cross-entropy of `inputs` against `targets`.
    pub fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Tensor {
        let positions = Tensor::arange(inputs.size()[1], (Kind::Int64, inputs.device()));
        let mut x = inputs.apply(&self.tokens) + positions.apply(&self.positions);
        for block in &self.blocks {
            x = block.forward(&x);
        }
        let logits = x.apply(&self.norm).apply(&self.head);
        let vocab = logits.size()[2];
        logits
            .view([-1, vocab])
            .to_kind(Kind::Float)
            .cross_entropy_for_logits(&targets.reshape([-1]))
    }
}

/// SGD's learning rate, for both sides.
pub const LR: f64 = 0.01;
/// SGD's momentum, for both sides.
pub const MOMENTUM: f64 = 0.9;

/// The model on `vs`'s device, its parameters in bf16.
pub fn model(vs: &mut nn::VarStore, c: &GptConfig) -> Gpt {
    nimbus_train::tch::manual_seed(c.seed);
    let gpt = Gpt::new(&vs.root(), c);
    vs.bfloat16();
    gpt
}

/// One training step: forward, backward, `sync` (the collective, or
/// nothing), the update; the loss read back to the host, as every loop
/// here does.
pub fn step(
    gpt: &Gpt,
    sgd: &mut Sgd,
    c: &GptConfig,
    step: u64,
    device: Device,
    sync: impl FnOnce() -> LoopResult,
) -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let (inputs, targets) = c.batch(step, device);
    let loss = gpt.loss(&inputs, &targets);
    sgd.zero_grad();
    loss.backward();
    sync()?;
    sgd.step();
    Ok(loss.double_value(&[]))
}

/// The GPT trained by nimbus: one report per step (`step`, `tokens`,
/// `loss`).
pub struct GptLoop;

impl TrainLoop for GptLoop {
    const NAME: &'static str = "bench.gpt";
    type Config = GptConfig;

    fn run(config: Self::Config, ctx: &mut TrainContext) -> LoopResult {
        let device = ctx.device();
        let mut vs = nn::VarStore::new(device);
        let gpt = model(&mut vs, &config);
        let distributed = ctx.prepare_model(&vs)?;
        let mut sgd = Sgd::new(&distributed, LR, MOMENTUM);
        for s in 0..config.steps {
            let loss = step(&gpt, &mut sgd, &config, s, device, || {
                ctx.sync_gradients(&distributed)?;
                Ok(())
            })?;
            let metrics = Metrics::from([
                ("step".to_string(), (s + 1) as f64),
                ("loss".to_string(), loss),
                ("tokens".to_string(), config.tokens_per_step() as f64),
            ]);
            ctx.report(metrics, None)?;
        }
        Ok(())
    }
}

/// The same steps in a plain tch loop on `device`: tokens/s from step
/// `warmup` to the end.
pub fn plain_rate(
    c: &GptConfig,
    warmup: u64,
    device: Device,
) -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let mut vs = nn::VarStore::new(device);
    let gpt = model(&mut vs, c);
    let single = DistributedModel::single(&vs)?;
    let mut sgd = Sgd::new(&single, LR, MOMENTUM);
    let mut start = std::time::Instant::now();
    for s in 0..c.steps {
        if s == warmup {
            start = std::time::Instant::now();
        }
        step(&gpt, &mut sgd, c, s, device, || Ok(()))?;
    }
    Ok(((c.steps - warmup) as i64 * c.tokens_per_step()) as f64 / start.elapsed().as_secs_f64())
}
