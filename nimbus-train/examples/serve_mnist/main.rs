//! Serves the MNIST CNN of a `train_mnist` checkpoint over HTTP: two
//! replicas of 0.5 CPU, each loading the checkpoint with tch, with dynamic
//! batching (up to 16 requests in one forward pass while a replica is
//! busy). Then, as a client would, it POSTs generated digits (784 pixel
//! intensities in `[0, 1]` as a JSON array) from 8 threads and checks each
//! answer against the same checkpoint run here.
//!
//! ```text
//! make run EXAMPLE=train_mnist ARGS="--storage /tmp/runs"   # ends with checkpoint=DIR
//! make run EXAMPLE=serve_mnist ARGS="--checkpoint DIR"
//! ```
//!
//! You should see the address it serves on and a `curl` line to try, a few
//! `digit 7 -> 7 (p=0.998)` lines, then `summary: requests=1000
//! accuracy=0.98 agree_with_local=1000 ...` (the accuracy is the
//! checkpoint's: about 0.98 after train_mnist's two default epochs).
//! `--hold` keeps serving until Enter is pressed (serve_bench runs it so,
//! with `--requests 0`, and measures it with wrk).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use clap::Parser;
use nimbus::actor::Registry;
use nimbus_serve::{Application, HttpOptions, RegistryExt, Serve};

/// The generated digits `train_mnist` trains on by default.
#[path = "../train_mnist/data/digits.rs"]
mod digits;
mod model;
#[path = "../train_mnist/network.rs"]
mod network;

use digits::generate_digits;

use model::{MnistCnn, Prediction};

#[derive(Parser)]
struct Args {
    /// A `train_mnist` checkpoint directory (the `checkpoint=` of its
    /// summary line).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The port the HTTP ingress listens on (0: any free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Requests a replica runs as one forward pass, gathered while it is
    /// busy (1: no batching).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    max_batch_size: u32,
    /// Digits to classify over HTTP (0: none, with --hold: only serve).
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Seeds the generated digits.
    #[arg(long, default_value_t = 99)]
    seed: u64,
    /// Keep serving until Enter is pressed.
    #[arg(long)]
    hold: bool,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

/// Client threads.
const CLIENTS: usize = 8;

fn main() -> Result<()> {
    let (driver, args) =
        nimbus::init_parsed::<Args>(Registry::new().deployment::<MnistCnn>(), |args| {
            nimbus::InitOptions::private(args.cluster.nodes.unwrap_or(1))
        })?;
    // Replicas run elsewhere: they get the checkpoint's absolute path.
    let checkpoint = std::fs::canonicalize(&args.checkpoint).with_context(|| {
        format!(
            "no checkpoint directory {} (make run EXAMPLE=train_mnist prints one as checkpoint=DIR)",
            args.checkpoint.display()
        )
    })?;
    let local = MnistCnn::load(&checkpoint).map_err(anyhow::Error::msg)?;
    let (images, labels) = model::test_digits(args.requests, args.seed);
    driver.block_on(async {
        let serve = Serve::start(HttpOptions::default().port(args.port)).await?;
        let mut app = Application::new::<MnistCnn>(checkpoint.clone())?
            .route_prefix("/mnist")
            .num_replicas(2)
            .num_cpus(0.5)
            .max_ongoing_requests(args.max_batch_size.max(5));
        if args.max_batch_size > 1 {
            app = app.batching(args.max_batch_size, Duration::from_millis(5));
        }
        serve.run(app).await?;
        let url = format!("http://{}/mnist", serve.addresses()[0]);
        // serve_bench reads this line for the address.
        println!("serving {} on {url}", checkpoint.display());
        println!("try: curl -s {url} -d \"$(python3 -c 'print([0.0]*784)')\"");
        let started = Instant::now();
        let client_images = images.clone();
        let served = tokio::task::spawn_blocking(move || classify(&url, &client_images)).await??;
        let took = started.elapsed();
        if args.hold {
            println!("serving until Enter is pressed");
            tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
                .await??;
        }
        serve.shutdown().await?;
        if served.is_empty() {
            println!("summary: requests=0");
            return Ok(());
        }
        let expected = local.predict(&images);
        for ((answer, label), _) in served.iter().zip(&labels).zip(0..5) {
            println!(
                "digit {label} -> {} (p={:.3})",
                answer.digit, answer.probability
            );
        }
        let right = served
            .iter()
            .zip(&labels)
            .filter(|(p, l)| p.digit == **l)
            .count();
        let agree = served
            .iter()
            .zip(&expected)
            .filter(|(served, here)| served.digit == here.digit)
            .count();
        let n = served.len();
        println!(
            "summary: requests={n} accuracy={:.3} agree_with_local={agree} requests_per_s={:.0}",
            right as f64 / n as f64,
            n as f64 / took.as_secs_f64()
        );
        ensure!(
            agree == n,
            "{} of {n} served predictions differ from the checkpoint's here",
            n - agree
        );
        Ok(())
    })
}

/// POSTs every image to `url` from `CLIENTS` threads; the predictions in
/// the images' order, or the first failed request.
fn classify(url: &str, images: &[Vec<f32>]) -> Result<Vec<Prediction>> {
    let chunk = images.len().div_ceil(CLIENTS).max(1);
    std::thread::scope(|scope| {
        let clients: Vec<_> = images
            .chunks(chunk)
            .map(|images| {
                scope.spawn(move || {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .timeout_global(Some(Duration::from_secs(30)))
                        .build()
                        .into();
                    images
                        .iter()
                        .map(|image| {
                            let body = serde_json::to_string(image)?;
                            let mut answer = agent
                                .post(url)
                                .header("content-type", "application/json")
                                .send(&body)
                                .with_context(|| format!("POST {url}"))?;
                            Ok(serde_json::from_str(&answer.body_mut().read_to_string()?)?)
                        })
                        .collect::<Result<Vec<Prediction>>>()
                })
            })
            .collect();
        let mut predictions = Vec::with_capacity(images.len());
        for client in clients {
            predictions.extend(
                client
                    .join()
                    .map_err(|_| anyhow::anyhow!("a client panicked"))??,
            );
        }
        Ok(predictions)
    })
}
