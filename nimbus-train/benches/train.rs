//! Training benchmarks, each side by side with its peer in the same run:
//!
//! - `overhead`: nimbus with 1 worker vs a plain tch loop of the same CNN in
//!   this process (framework overhead);
//! - `ddp`: nimbus with 2 workers vs PyTorch DDP (gloo, torchrun), batch 64
//!   per worker, 1 thread per worker, the same warm-up and timed steps, each
//!   step gathering its batch by sampled indices and reading the loss back,
//!   and each one's scaling efficiency;
//! - `allreduce`: the shared-memory collective between 2 processes vs gloo
//!   over TCP loopback, for 4 KiB, 1 MiB, 16 MiB and 64 MiB (bus bandwidth;
//!   for 2 ranks it equals the algorithm bandwidth). `shm_vs_gloo_tcp` is a
//!   same-host fast path against a network transport, not like for like;
//!   `network_vs_gloo_tcp` is: nimbus's network collective (a ring over
//!   QUIC between 2 worker processes) against gloo;
//! - `recovery`: from a worker's SIGKILL to the first step completed
//!   after the group healed from a live peer, and after it restarted from
//!   its checkpoint (`RunConfig::peer_heal(false)`), in the same run, with
//!   the steps each did twice;
//! - `gpu` (where libtorch sees a CUDA device): the `overhead` comparison
//!   on GPU 0;
//! - `gpt`: a small GPT-style transformer (`models/gpt.rs`, bf16), tokens/s
//!   of nimbus with 1 worker vs a plain tch loop (framework overhead) and
//!   vs a plain PyTorch eager loop (`peers/gpt_eager.py`), on GPU 0; with
//!   no CUDA device only a toy shape on the CPU, as a smoke test;
//! - `nccl` (feature `cuda`, on a GPU machine): NCCL allreduce on device
//!   memory with 1 rank against `torch.distributed`'s NCCL allreduce
//!   (4 KiB to 256 MiB), and with 2 ranks sharing the GPU through per-rank
//!   `NCCL_HOSTID`s (NCCL's socket transport: a functional check, its
//!   figures say nothing of real multi-GPU links), which must average 1
//!   and 2 to exactly 1.5 everywhere (else the bench fails).
//!
//! ```text
//! make bench            # or: cargo bench --bench train
//! ```
//!
//! Name parts to run only those: `cargo bench --bench train -- ddp`.
//!
//! The peers need a Python with torch (`NIMBUS_PYTHON`, else `python3` on
//! PATH; `make bench` puts the cached torch venv first); without one they
//! are skipped and say so. Their scripts are read from this package's
//! `benches/peers`, or from `NIMBUS_BENCH_PEERS` (a GPU bundle carries
//! them). Run without `--bench` (as `cargo test
//! --all-targets` does), everything is tiny and the peers are skipped: a
//! smoke test that the benchmark still works.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "models/gpt.rs"]
mod gpt;
#[path = "../examples/train_mnist/mnist.rs"]
mod mnist;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};
use mnist::{network, DataSource, FailMode, MnistConfig, MnistLoop};
use nimbus_train::collective::{Collective, SharedMemoryGroup};
use nimbus_train::tch::{nn, nn::ModuleT, Cuda, Device};
use nimbus_train::{
    CollectiveBackend, DistributedModel, DistributedSampler, LoopResult, Metrics, RunConfig,
    ScalingConfig, Sgd, TrainContext, TrainEvent, TrainLoop, TrainRegistry, Trainer,
};

/// Set in the environment of the second allreduce process: its segment.
const ALLREDUCE_PEER: &str = "NIMBUS_BENCH_ALLREDUCE_PEER";
/// The trainer's bucket size, for a like-for-like collective.
const BUCKET: usize = 4 << 20;
const SIZES: [usize; 4] = [4 << 10, 1 << 20, 16 << 20, 64 << 20];
/// Where the peer scripts are, if not in this package's `benches/peers`.
const PEERS: &str = "NIMBUS_BENCH_PEERS";

#[derive(Clone, Copy)]
struct Scale {
    full: bool,
    steps: u64,
    warmup: u64,
}

fn main() -> Result<()> {
    #[cfg(feature = "cuda")]
    if let Ok(id) = std::env::var(NCCL_PEER) {
        let (_, wrong) = nccl_rank(&id, 1, 2, &nccl_sizes(full()))?;
        if wrong > 0 {
            bail!("rank 1 averaging 1 and 2: {wrong} elements are not 1.5");
        }
        return Ok(());
    }
    if let Some(path) = std::env::var_os(ALLREDUCE_PEER) {
        return allreduce_times(Path::new(&path), 1, &sizes(full())).map(drop);
    }
    let registry = nimbus::actor::Registry::new()
        .train_loop::<MnistLoop>()
        .train_loop::<AllreduceLoop>()
        .train_loop::<gpt::GptLoop>();
    let driver = nimbus::init_with(registry, nimbus::InitOptions::private(1))?;
    let scale = if full() {
        Scale {
            full: true,
            steps: 300,
            warmup: 20,
        }
    } else {
        Scale {
            full: false,
            steps: 5,
            warmup: 2,
        }
    };
    let system = actix::System::new();
    let result = system.block_on(async {
        driver.connect().await?;
        let python = if scale.full {
            python()
        } else {
            println!("# peers skipped: smoke mode (run with --bench, as `make bench` does)");
            None
        };
        if selected("overhead") {
            overhead(&scale).await?;
        }
        if selected("ddp") {
            ddp(&scale, python.as_deref()).await?;
        }
        if selected("allreduce") {
            allreduce(&scale, python.as_deref()).await?;
        }
        if selected("recovery") {
            recovery(&scale).await?;
        }
        if selected("gpu") {
            gpu_overhead(&scale).await?;
        }
        if selected("gpt") {
            gpt_rates(&scale, python.as_deref()).await?;
        }
        #[cfg(feature = "cuda")]
        if selected("nccl") {
            nccl_bandwidth(&scale, python.as_deref()).await?;
        }
        Ok(())
    });
    drop(driver);
    let _ = std::fs::remove_dir_all(storage());
    result
}

/// Whether part `name` runs: all, unless parts are named on the command
/// line (`cargo bench --bench train -- allreduce`).
fn selected(name: &str) -> bool {
    let named: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    named.is_empty() || named.iter().any(|n| n == name)
}

fn full() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn sizes(full: bool) -> Vec<usize> {
    if full {
        SIZES.to_vec()
    } else {
        vec![4 << 10, 1 << 20]
    }
}

/// A Python with torch, for the peers.
fn python() -> Option<String> {
    let candidates = [
        std::env::var("NIMBUS_PYTHON").ok(),
        Some("python3".into()),
        Some("python".into()),
    ];
    let found = candidates.into_iter().flatten().find(|python| {
        Command::new(python)
            .args(["-c", "import torch.distributed"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        println!("# peers skipped: no Python with torch (set NIMBUS_PYTHON)");
    }
    found
}

fn peer_script(name: &str) -> PathBuf {
    match std::env::var_os(PEERS) {
        Some(dir) => PathBuf::from(dir).join(name),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("benches/peers")
            .join(name),
    }
}

/// Runs a peer script under torchrun with `processes`; its stdout.
async fn torchrun(python: &str, processes: usize, script: &str, args: &[String]) -> Result<String> {
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let mut command = tokio::process::Command::new(python);
    if processes > 0 {
        command.args(["-m", "torch.distributed.run", "--nproc-per-node"]);
        command
            .arg(processes.to_string())
            .arg(format!("--master-port={port}"));
    }
    let output = command
        .arg(peer_script(script))
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .await
        .with_context(|| format!("running {script}"))?;
    if !output.status.success() {
        bail!(
            "{script} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn config(scale: &Scale, workers: usize) -> MnistConfig {
    let steps = scale.warmup + scale.steps;
    MnistConfig {
        epochs: 1,
        batch_size: 64,
        // One more batch than run: the epoch (its evaluation and checkpoint)
        // does not end inside the measurement.
        data: DataSource::Embedded {
            train: 64 * workers.max(1) * (steps as usize + 1),
            test: 100,
        },
        max_steps: Some(steps),
        ..MnistConfig::default()
    }
}

fn storage() -> PathBuf {
    std::env::temp_dir().join(format!("nimbus-bench-{}", std::process::id()))
}

/// Runs `trainer`; the seconds between its reports of steps `from` and
/// `to` (metric `step`), as they reach the driver.
async fn seconds_between_reports<L: TrainLoop>(
    trainer: Trainer<L>,
    from: u64,
    to: u64,
    what: &str,
) -> Result<f64> {
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let result = trainer
        .on_event(move |e| {
            if let TrainEvent::Reported { metrics, .. } = e {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((metrics["step"] as u64, Instant::now()));
            }
        })
        .fit()
        .await;
    if let Some(error) = result.error {
        bail!("{what} failed: {error}");
    }
    let arrivals = arrivals.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let at = |step: u64| arrivals.iter().find(|(s, _)| *s == step).map(|(_, t)| *t);
    let (Some(start), Some(end)) = (at(from), at(to)) else {
        bail!("{what} is missing reports");
    };
    Ok((end - start).as_secs_f64())
}

/// Steady-state samples/s of a nimbus run: reports `warmup` to the end, as
/// they reach the driver.
async fn nimbus_rate(scale: &Scale, workers: usize, gpu: bool) -> Result<f64> {
    let run = RunConfig::new(format!("rate-{workers}"), storage());
    let scaling = ScalingConfig::workers(workers).use_gpu(gpu);
    let trainer = Trainer::<MnistLoop>::new(config(scale, workers), scaling, run);
    let what = format!("nimbus run with {workers} workers");
    let seconds =
        seconds_between_reports(trainer, scale.warmup, scale.warmup + scale.steps, &what).await?;
    Ok((scale.steps * 64 * workers as u64) as f64 / seconds)
}

/// The same CNN trained by a plain tch loop in this process, with the
/// MNIST loop's very step (its sampler's batches, its SGD, the loss read
/// back each step) minus what nimbus adds: the worker process, the
/// collective call and the report to the driver.
fn plain_rate(scale: &Scale, device: Device) -> Result<f64> {
    nimbus_train::tch::set_num_threads(1);
    let config = config(scale, 1);
    nimbus_train::tch::manual_seed(config.seed as i64);
    let data = config.load().map_err(|e| anyhow::anyhow!(e))?;
    let vs = nn::VarStore::new(device);
    let net = network(&vs.root());
    let model = DistributedModel::single(&vs)?;
    let mut sgd = Sgd::new(&model, config.lr, config.momentum);
    let batches = DistributedSampler::new(data.train.len(), 1, 0)
        .seed(config.seed)
        .batches(0, config.batch_size);
    let mut start = Instant::now();
    for (step, indices) in batches
        .iter()
        .take((scale.warmup + scale.steps) as usize)
        .enumerate()
    {
        if step as u64 == scale.warmup {
            start = Instant::now();
        }
        let (images, labels) = data.train.batch(indices);
        let loss = net
            .forward_t(&images.to_device(device), true)
            .cross_entropy_for_logits(&labels.to_device(device));
        sgd.zero_grad();
        loss.backward();
        sgd.step();
        let _ = loss.double_value(&[]);
    }
    Ok((scale.steps * 64) as f64 / start.elapsed().as_secs_f64())
}

async fn overhead(scale: &Scale) -> Result<()> {
    let names = [
        "train_plain_tch_1thread",
        "train_nimbus_1worker",
        "train_overhead_1worker",
    ];
    mnist_overhead(scale, Device::Cpu, names).await
}

/// `overhead` on GPU 0: the MNIST CNN, 1 GPU worker against the plain tch
/// loop on the same GPU.
async fn gpu_overhead(scale: &Scale) -> Result<()> {
    if !Cuda::is_available() {
        println!("# gpu skipped: libtorch sees no CUDA device");
        return Ok(());
    }
    let names = [
        "train_cuda_plain_tch",
        "train_cuda_nimbus_1worker",
        "train_cuda_overhead_1worker",
    ];
    mnist_overhead(scale, Device::Cuda(0), names).await
}

/// The plain loop's and 1 nimbus worker's samples/s on `device`, and the
/// overhead, printed under `names`.
async fn mnist_overhead(scale: &Scale, device: Device, names: [&str; 3]) -> Result<()> {
    // Off the driver's async thread: a long blocking loop there would
    // starve its QUIC connections.
    let plain_scale = *scale;
    let plain = tokio::task::spawn_blocking(move || plain_rate(&plain_scale, device)).await??;
    let nimbus = nimbus_rate(scale, 1, device != Device::Cpu).await?;
    let [plain_name, nimbus_name, overhead_name] = names;
    println!("{plain_name}: {plain:.0} samples/s");
    println!("{nimbus_name}: {nimbus:.0} samples/s");
    println!("{overhead_name}: {:.1} %", (plain / nimbus - 1.0) * 100.0);
    Ok(())
}

/// The GPT's tokens/s: nimbus with 1 GPU worker, a plain tch loop and a
/// plain PyTorch eager loop, on GPU 0 (on the CPU without one: a toy
/// shape, nimbus and tch only).
async fn gpt_rates(scale: &Scale, python: Option<&str>) -> Result<()> {
    let gpu = Cuda::is_available();
    let (warmup, timed) = if scale.full { (5, 30) } else { (1, 2) };
    let shape = if gpu && scale.full {
        gpt::GptConfig::gpu(warmup + timed)
    } else {
        gpt::GptConfig::tiny(warmup + timed)
    };
    let device = if gpu { Device::Cuda(0) } else { Device::Cpu };
    let plain = tokio::task::spawn_blocking(move || gpt::plain_rate(&shape, warmup, device))
        .await?
        .map_err(|e| anyhow::anyhow!("the plain GPT loop failed: {e}"))?;
    let scaling = ScalingConfig::workers(1).use_gpu(gpu);
    let trainer = Trainer::<gpt::GptLoop>::new(shape, scaling, RunConfig::new("gpt", storage()));
    let seconds =
        seconds_between_reports(trainer, warmup, warmup + timed, "the nimbus GPT run").await?;
    let nimbus = (timed as i64 * shape.tokens_per_step()) as f64 / seconds;
    let on = if gpu { "cuda" } else { "cpu_toy" };
    println!("gpt_{on}_plain_tch: {plain:.0} tokens/s");
    println!("gpt_{on}_nimbus_1worker: {nimbus:.0} tokens/s");
    println!(
        "gpt_{on}_overhead_1worker: {:.1} %",
        (plain / nimbus - 1.0) * 100.0
    );
    if let (true, true, Some(python)) = (gpu, scale.full, python) {
        // A failing peer is reported, and fails none of nimbus's figures.
        match gpt_eager_rate(python, &shape, warmup).await {
            Ok(eager) => {
                println!("gpt_cuda_pytorch_eager: {eager:.0} tokens/s");
                println!("gpt_cuda_nimbus_vs_pytorch_eager: {:.3} x", nimbus / eager);
            }
            Err(e) => println!("# the PyTorch eager GPT peer failed: {e:#}"),
        }
    }
    Ok(())
}

/// Tokens/s of `peers/gpt_eager.py` for `shape` (its steps, the first
/// `warmup` untimed).
async fn gpt_eager_rate(python: &str, shape: &gpt::GptConfig, warmup: u64) -> Result<f64> {
    let script = peer_script("gpt_eager.py");
    let args = [
        shape.vocab,
        shape.context,
        shape.dim,
        shape.layers,
        shape.heads,
        shape.batch,
        shape.steps as i64,
        warmup as i64,
    ];
    let output = tokio::process::Command::new(python)
        .arg(&script)
        .args(args.iter().map(i64::to_string))
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("tokens_per_s "))
        .context("gpt_eager.py printed no tokens_per_s line")?
        .trim()
        .parse()?)
}

async fn ddp(scale: &Scale, python: Option<&str>) -> Result<()> {
    let one = nimbus_rate(scale, 1, false).await?;
    let two = nimbus_rate(scale, 2, false).await?;
    println!("train_nimbus_2workers: {two:.0} samples/s");
    println!(
        "train_nimbus_scaling_efficiency: {:.1} %",
        two / (2.0 * one) * 100.0
    );
    let Some(python) = python else {
        return Ok(());
    };
    let parse = |out: String| -> Result<f64> {
        out.lines()
            .find_map(|l| l.strip_prefix("samples_per_s "))
            .context("no samples_per_s line")?
            .trim()
            .parse()
            .context("samples_per_s")
    };
    // The same number of timed steps after the same warm-up.
    let steps = [scale.steps.to_string(), scale.warmup.to_string()];
    let ddp_one = parse(torchrun(python, 0, "ddp_mnist.py", &steps).await?)?;
    let ddp_two = parse(torchrun(python, 2, "ddp_mnist.py", &steps).await?)?;
    println!("train_ddp_gloo_2workers: {ddp_two:.0} samples/s");
    println!(
        "train_ddp_gloo_scaling_efficiency: {:.1} %",
        ddp_two / (2.0 * ddp_one) * 100.0
    );
    println!("train_nimbus_vs_ddp_2workers: {:.2} x", two / ddp_two);
    Ok(())
}

/// Times allreduces through the run's collective: for each `(bytes,
/// iterations)`, one warm-up and `iterations` timed sums of `bytes` of f32;
/// rank 0 reports `bytes` and the seconds per allreduce.
struct AllreduceLoop;

impl TrainLoop for AllreduceLoop {
    const NAME: &'static str = "bench.allreduce";
    type Config = Vec<(usize, usize)>;

    fn run(config: Self::Config, ctx: &mut TrainContext) -> LoopResult {
        for (bytes, iterations) in config {
            let mut values = vec![1.0f32; bytes / 4];
            ctx.collective().allreduce_sum(&mut values)?;
            let start = Instant::now();
            for _ in 0..iterations {
                ctx.collective().allreduce_sum(&mut values)?;
            }
            let seconds = start.elapsed().as_secs_f64() / iterations as f64;
            let metrics = Metrics::from([
                ("bytes".to_string(), bytes as f64),
                ("seconds".to_string(), seconds),
            ]);
            ctx.report(metrics, None)?;
        }
        Ok(())
    }
}

/// Seconds per allreduce of each size through nimbus's network collective
/// (a ring over QUIC) between 2 worker processes.
async fn network_allreduce_times(sizes: &[usize], full: bool) -> Result<Vec<f64>> {
    let times = |size| if full { iterations(size) } else { 5 };
    let config: Vec<(usize, usize)> = sizes.iter().map(|s| (*s, times(*s))).collect();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let seen = reports.clone();
    let scaling = ScalingConfig::workers(2).collective(CollectiveBackend::Network);
    let run = RunConfig::new("allreduce-network", storage());
    let result = Trainer::<AllreduceLoop>::new(config, scaling, run)
        .on_event(move |e| {
            if let TrainEvent::Reported { metrics, .. } = e {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((metrics["bytes"] as usize, metrics["seconds"]));
            }
        })
        .fit()
        .await;
    if let Some(error) = result.error {
        bail!("the network allreduce run failed: {error}");
    }
    let reports = reports.lock().unwrap_or_else(|e| e.into_inner()).clone();
    sizes
        .iter()
        .map(|size| {
            reports
                .iter()
                .find(|(bytes, _)| bytes == size)
                .map(|(_, seconds)| *seconds)
                .with_context(|| format!("no network allreduce report for {size} bytes"))
        })
        .collect()
}

/// Seconds per allreduce of each size by peer `script` under torchrun with
/// `processes` (its lines `<bytes> <seconds>`); none without a Python.
async fn peer_allreduce_times(
    python: Option<&str>,
    processes: usize,
    script: &str,
    sizes: &[usize],
) -> Result<Vec<Option<f64>>> {
    let Some(python) = python else {
        return Ok(vec![None; sizes.len()]);
    };
    let args: Vec<String> = sizes.iter().map(usize::to_string).collect();
    let out = torchrun(python, processes, script, &args).await?;
    Ok(sizes
        .iter()
        .map(|size| {
            out.lines()
                .filter_map(|l| l.split_once(' '))
                .find(|(s, _)| s.parse::<usize>().ok() == Some(*size))
                .and_then(|(_, t)| t.trim().parse().ok())
        })
        .collect())
}

fn label(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{}MiB", size >> 20)
    } else {
        format!("{}KiB", size >> 10)
    }
}

fn iterations(size: usize) -> usize {
    ((256usize << 20) / size).clamp(5, 2000)
}

fn allreduce_times(path: &Path, rank: usize, sizes: &[usize]) -> Result<Vec<f64>> {
    let mut group = SharedMemoryGroup::join(path, rank, 2, BUCKET, Duration::from_secs(30))?;
    let mut times = Vec::new();
    for &size in sizes {
        let mut values = vec![1.0f32; size / 4];
        let n = iterations(size);
        for _ in 0..(n / 10).max(2) {
            group.allreduce_sum(&mut values)?;
        }
        group.barrier()?;
        let start = Instant::now();
        for _ in 0..n {
            group.allreduce_sum(&mut values)?;
        }
        times.push(start.elapsed().as_secs_f64() / n as f64);
    }
    Ok(times)
}

async fn allreduce(scale: &Scale, python: Option<&str>) -> Result<()> {
    let sizes = sizes(scale.full);
    let path = std::env::temp_dir().join(format!("nimbus-bench-allreduce-{}", std::process::id()));
    let mut peer = Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env(ALLREDUCE_PEER, &path)
        .spawn()
        .context("starting the second allreduce process")?;
    // Off the driver's async thread, which must keep its connections alive.
    let (rank0_path, rank0_sizes) = (path.clone(), sizes.clone());
    let times =
        tokio::task::spawn_blocking(move || allreduce_times(&rank0_path, 0, &rank0_sizes)).await?;
    let status = peer.wait()?;
    let times = times?;
    if !status.success() {
        bail!("the second allreduce process failed: {status}");
    }
    let network = network_allreduce_times(&sizes, scale.full).await?;
    let gloo = peer_allreduce_times(python, 2, "gloo_allreduce.py", &sizes).await?;
    let rows = sizes.iter().zip(times).zip(network).zip(gloo);
    for (((size, seconds), network), gloo) in rows {
        let name = label(*size);
        let busbw = |t: f64| *size as f64 / t / 1e9;
        println!(
            "allreduce_nimbus_shm_{name}_latency: {:.1} us",
            seconds * 1e6
        );
        println!(
            "allreduce_nimbus_shm_{name}_busbw: {:.2} GB/s",
            busbw(seconds)
        );
        println!(
            "allreduce_nimbus_network_{name}_latency: {:.1} us",
            network * 1e6
        );
        println!(
            "allreduce_nimbus_network_{name}_busbw: {:.2} GB/s",
            busbw(network)
        );
        if let Some(gloo) = gloo {
            println!("allreduce_gloo_tcp_{name}_latency: {:.1} us", gloo * 1e6);
            println!("allreduce_gloo_tcp_{name}_busbw: {:.2} GB/s", busbw(gloo));
            // Not like for like: shared memory against gloo's TCP loopback
            // (a same-host fast path against a network transport).
            println!(
                "allreduce_nimbus_shm_vs_gloo_tcp_{name}: {:.2} x",
                gloo / seconds
            );
            // Like for like: two processes over the loopback network.
            println!(
                "allreduce_nimbus_network_vs_gloo_tcp_{name}: {:.2} x",
                gloo / network
            );
        }
    }
    Ok(())
}

async fn recovery(scale: &Scale) -> Result<()> {
    let runs = if scale.full { 3 } else { 1 };
    for (mode, heal) in [("peer_heal", true), ("checkpoint_restart", false)] {
        let mut seconds = Vec::new();
        let mut redone = Vec::new();
        for run in 0..runs {
            let (took, steps_redone) = recover_once(&format!("{mode}-{run}"), heal).await?;
            seconds.push(took);
            redone.push(steps_redone);
        }
        seconds.sort_by(f64::total_cmp);
        redone.sort_unstable();
        let name = if heal {
            "peer_heal"
        } else {
            "checkpoint_restart"
        };
        let steps = if heal { "peer" } else { "checkpoint" };
        println!("recovery_{name}_s: {:.2} s", seconds[seconds.len() / 2]);
        println!(
            "recovery_{steps}_steps_redone: {} steps",
            redone[redone.len() / 2]
        );
    }
    let _ = std::fs::remove_dir_all(storage());
    Ok(())
}

/// One run of 20 steps on 2 workers whose last rank SIGKILLs itself at
/// step 12 (checkpoints every 5), healed from its peer (`heal`) or
/// restarted from checkpoint 10: seconds from the death to the first step
/// completed after it, and the steps done twice.
async fn recover_once(name: &str, heal: bool) -> Result<(f64, usize)> {
    let config = MnistConfig {
        fail_at_step: Some(12),
        fail_mode: FailMode::Kill,
        checkpoint_every: Some(5),
        ..config(
            &Scale {
                full: false,
                steps: 20,
                warmup: 0,
            },
            2,
        )
    };
    let run_config = RunConfig::new(format!("recovery-{name}"), storage())
        .max_failures(1)
        .peer_heal(heal);
    let run_dir = run_config.run_dir();
    // Report indices in order, and when the first after the death came.
    let seen = Arc::new(Mutex::new((Vec::new(), None)));
    let (record, mut lost, name) = (seen.clone(), false, name.to_string());
    let result = Trainer::<MnistLoop>::new(config, ScalingConfig::workers(2), run_config)
        .on_event(move |e| {
            let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
            match e {
                TrainEvent::Failed { reason, .. } | TrainEvent::Healing { reason, .. } => {
                    println!("# recovery {name}: {reason}");
                    lost = true
                }
                TrainEvent::Reported { index, .. } => {
                    seen.0.push(*index);
                    if lost {
                        seen.1.get_or_insert_with(SystemTime::now);
                    }
                }
                _ => {}
            }
        })
        .fit()
        .await;
    let name = run_dir.display();
    if let Some(error) = result.error {
        bail!("recovery run {name} failed: {error}");
    }
    let restarts = u32::from(!heal);
    if result.restarts != restarts {
        bail!(
            "recovery run {name} restarted {} times, not {restarts}",
            result.restarts
        );
    }
    let marker = run_dir.join("injected-failure");
    let died: f64 = std::fs::read_to_string(&marker)
        .with_context(|| format!("reading {}", marker.display()))?
        .trim()
        .parse()?;
    let (indices, first) = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    let first = first.context("no step after the death")?;
    let mut done = 0;
    let redone = indices
        .iter()
        .filter(|&&index| {
            let again = index <= done;
            done = done.max(index);
            again
        })
        .count();
    Ok((
        first.duration_since(UNIX_EPOCH)?.as_secs_f64() - died,
        redone,
    ))
}

/// Set in the environment of the second NCCL process: the unique id (hex).
#[cfg(feature = "cuda")]
const NCCL_PEER: &str = "NIMBUS_BENCH_NCCL_PEER";

/// The NCCL sizes: 4 KiB to 256 MiB (smoke: 4 KiB and 1 MiB).
#[cfg(feature = "cuda")]
fn nccl_sizes(full: bool) -> Vec<usize> {
    if full {
        vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20]
    } else {
        vec![4 << 10, 1 << 20]
    }
}

/// Rank `rank`'s NCCL variables: its own `NCCL_HOSTID`, so that two ranks
/// on one GPU form a group (the trainer's `nccl_host_id_per_rank`).
#[cfg(feature = "cuda")]
fn nccl_env(rank: usize) -> Vec<(String, String)> {
    nimbus_train::NcclSettings {
        host_id_per_rank: true,
        ..Default::default()
    }
    .for_rank(rank)
}

/// Seconds per in-place NCCL allreduce (mean) of each size, as `rank` of
/// `world` on GPU 0, on device memory; then, with 2 ranks, the exact
/// average check: rank r contributes r + 1 everywhere, and every element
/// must read 1.5 (the count of those that do not is returned).
#[cfg(feature = "cuda")]
fn nccl_rank(
    id_hex: &str,
    rank: usize,
    world: usize,
    sizes: &[usize],
) -> Result<(Vec<f64>, usize)> {
    use cudarc::driver::result as cuda;
    use nimbus_train::collective::nccl::NcclGroup;
    let id: Vec<u8> = (0..id_hex.len() / 2)
        .map(|i| u8::from_str_radix(&id_hex[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()?;
    nimbus_train::collective::nccl::probe()?;
    // SAFETY: device 0's primary context, made current on this thread.
    unsafe {
        let device = cuda::device::get(0)?;
        let context = cuda::primary_ctx::retain(device)?;
        cuda::ctx::set_current(context)?;
    }
    let mut group = NcclGroup::join(&id, rank, world, Duration::from_secs(60), &nccl_env(rank))?;
    let mut times = Vec::new();
    for &size in sizes {
        // SAFETY: a fresh device buffer of `size` bytes, freed below.
        unsafe {
            let buffer = cuda::malloc_sync(size)?;
            // Two ranks take turns on the one GPU over sockets: fewer
            // calls, so that the check stays within its time.
            let n = if world == 1 {
                iterations(size)
            } else {
                iterations(size).min(20)
            };
            for _ in 0..(n / 10).max(2) {
                group.allreduce_mean_device(buffer as *mut f32, size / 4)?;
            }
            let start = Instant::now();
            for _ in 0..n {
                group.allreduce_mean_device(buffer as *mut f32, size / 4)?;
            }
            times.push(start.elapsed().as_secs_f64() / n as f64);
            cuda::free_sync(buffer)?;
        }
    }
    let mut wrong = 0;
    if world == 2 {
        let mut values = vec![(rank + 1) as f32; (1 << 20) / 4];
        // SAFETY: a device buffer of the host vector's size, copied to,
        // averaged in place, copied back, freed.
        unsafe {
            let buffer = cuda::malloc_sync(values.len() * 4)?;
            cuda::memcpy_htod_sync(buffer, &values)?;
            group.allreduce_mean_device(buffer as *mut f32, values.len())?;
            cuda::memcpy_dtoh_sync(&mut values, buffer)?;
            cuda::free_sync(buffer)?;
        }
        wrong = values
            .iter()
            .filter(|v| v.to_bits() != 1.5f32.to_bits())
            .count();
        if wrong > 0 {
            eprintln!(
                "rank {rank}: {wrong} of {} elements are not 1.5",
                values.len()
            );
        }
    }
    Ok((times, wrong))
}

/// NCCL allreduce on 1 GPU against torch.distributed's, and 2 ranks
/// sharing the GPU (per-rank host ids) with the exact average check.
#[cfg(feature = "cuda")]
async fn nccl_bandwidth(scale: &Scale, python: Option<&str>) -> Result<()> {
    use nimbus_train::collective::nccl::{nccl, unique_id, version_text};
    let loaded = nccl()?;
    println!(
        "# nimbus loaded NCCL {} from {}",
        version_text(loaded.version),
        loaded.path.display()
    );
    let sizes = nccl_sizes(scale.full);
    let hex = |id: Vec<u8>| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let one = hex(unique_id(&nccl_env(0))?);
    let sizes_one = sizes.clone();
    let (solo, _) =
        tokio::task::spawn_blocking(move || nccl_rank(&one, 0, 1, &sizes_one)).await??;
    // A failing peer is reported, and fails none of nimbus's checks.
    let torch = peer_allreduce_times(python, 1, "nccl_allreduce.py", &sizes)
        .await
        .unwrap_or_else(|e| {
            println!("# the torch.distributed NCCL peer failed: {e:#}");
            vec![None; sizes.len()]
        });
    for ((size, seconds), torch) in sizes.iter().zip(solo).zip(torch) {
        // One rank: NCCL's bus bandwidth factor 2(n-1)/n is 0; report the
        // algorithm bandwidth (the in-place copy it does).
        let name = label(*size);
        println!("nccl_1rank_{name}_latency: {:.1} us", seconds * 1e6);
        println!(
            "nccl_1rank_{name}_algbw: {:.2} GB/s",
            *size as f64 / seconds / 1e9
        );
        if let Some(torch) = torch {
            println!("nccl_torch_1rank_{name}_latency: {:.1} us", torch * 1e6);
            println!(
                "nccl_1rank_{name}_nimbus_vs_torch: {:.2} x",
                torch / seconds
            );
        }
    }
    let two = hex(unique_id(&nccl_env(0))?);
    let mut peer = tokio::process::Command::new(std::env::current_exe()?)
        .args(std::env::args().skip(1))
        .env(NCCL_PEER, &two)
        .kill_on_drop(true)
        .spawn()
        .context("starting the second NCCL process")?;
    let sizes_two = sizes.clone();
    let pair = tokio::task::spawn_blocking(move || nccl_rank(&two, 0, 2, &sizes_two)).await??;
    let status = tokio::time::timeout(Duration::from_secs(120), peer.wait())
        .await
        .context("the second NCCL rank did not exit within 120 s")??;
    if !status.success() {
        bail!("the second NCCL rank failed: {status}");
    }
    let (times, wrong) = pair;
    for (size, seconds) in sizes.iter().zip(times) {
        let name = label(*size);
        println!("nccl_2ranks_1gpu_{name}_latency: {:.1} us", seconds * 1e6);
        println!(
            "nccl_2ranks_1gpu_{name}_busbw: {:.2} GB/s",
            *size as f64 / seconds / 1e9
        );
    }
    println!("nccl_2ranks_1gpu_exact_average_wrong: {wrong} elements");
    if wrong > 0 {
        bail!("2 NCCL ranks averaging 1 and 2: {wrong} elements are not 1.5");
    }
    Ok(())
}
