//! nimbus Serve's request rate and latency, in the shape of issue 53's
//! Ray Serve figures (Ray Serve 2.60 on this kind of 2-core machine: 446–496
//! req/s, p50 30–34 ms, p99 72 ms): an echo deployment answering
//! `{"ok": true}`, 2 replicas of 0.5 CPU on a one-node local cluster, driven
//! by `wrk -t2 -c16 -d10s --latency` (Debian's `wrk` package) after a 2 s
//! warm-up. With `--ray PYTHON` (a Python with `ray[serve]`), Ray Serve's
//! same deployment (`ray_serve_echo.py`) is measured the same way in the
//! same run, after nimbus's, and the ratios printed.
//!
//! ```text
//! make run EXAMPLE=serve_bench
//! make run EXAMPLE=serve_bench ARGS="--ray ~/.cache/nimbus/ray-venv/bin/python"
//! ```
//!
//! You should see `serve_echo_c1_p50_ms` and `serve_echo_batched_c1_p50_ms`
//! (one connection, the same echo without and with dynamic batching:
//! what batching adds at low load), `serve_echo_rps`, `serve_echo_p50_ms`,
//! `serve_echo_p99_ms`; with `--ray`, `ray_serve_echo_rps`, its p50 and
//! p99, and `serve_echo_rps_ratio` (nimbus / Ray) and
//! `serve_echo_p99_ratio` (nimbus / Ray); then a last `summary:` line.
//! The MNIST CNN case of the issue is not measured yet.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Parser;
use nimbus::actor::Registry;
use nimbus_serve::{Application, Deployment, HandlerError, HttpOptions, RegistryExt, Serve};

/// Answers `{"ok": true}` whatever it is sent.
struct Echo;

impl Deployment for Echo {
    const NAME: &'static str = "serve_bench.Echo";
    type Init = ();
    type Request = serde::de::IgnoredAny;
    type Response = serde_json::Value;

    fn new(_: ()) -> Result<Self, String> {
        Ok(Echo)
    }

    async fn call(&self, _: serde::de::IgnoredAny) -> Result<serde_json::Value, HandlerError> {
        Ok(serde_json::json!({ "ok": true }))
    }
}

#[derive(Parser)]
struct Args {
    /// Seconds wrk measures.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// wrk's connections.
    #[arg(long, default_value_t = 16)]
    connections: u32,
    /// wrk's threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Replicas (0.5 CPU each).
    #[arg(long, default_value_t = 2)]
    replicas: u32,
    /// A Python with `ray[serve]`: measure Ray Serve too.
    #[arg(long)]
    ray: Option<PathBuf>,
    /// The port Ray Serve listens on.
    #[arg(long, default_value_t = 8011)]
    ray_port: u16,
    #[command(flatten)]
    cluster: nimbus::ClusterArgs,
}

/// What wrk measured.
struct Measured {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn main() -> Result<()> {
    let (driver, args) =
        nimbus::init_parsed::<Args>(Registry::new().deployment::<Echo>(), |args| {
            nimbus::InitOptions::private(args.cluster.nodes.unwrap_or(1))
        })?;
    ensure!(
        Command::new("wrk").arg("--version").output().is_ok(),
        "serve_bench drives the servers with wrk: install it (apt-get install wrk)"
    );
    let nimbus = driver.block_on(async {
        let serve = Serve::start(HttpOptions::default().port(0)).await?;
        let app = Application::new::<Echo>(())?
            .route_prefix("/echo")
            .num_replicas(args.replicas)
            .num_cpus(0.5);
        serve.run(app).await?;
        let batched = Application::new::<Echo>(())?
            .name("batched")
            .route_prefix("/batched")
            .num_replicas(args.replicas)
            .num_cpus(0.5)
            .max_ongoing_requests(16)
            .batching(16, Duration::from_millis(10));
        serve.run(batched).await?;
        let address = serve.addresses()[0];
        let (seconds, connections, threads) = (args.seconds, args.connections, args.threads);
        let measured = tokio::task::spawn_blocking(move || {
            let echo = measure(
                &format!("http://{address}/echo"),
                seconds,
                connections,
                threads,
            )?;
            // One connection: what batching adds when the replica is idle.
            let alone = measure(&format!("http://{address}/echo"), seconds, 1, 1)?;
            let batched = measure(&format!("http://{address}/batched"), seconds, 1, 1)?;
            anyhow::Ok((echo, alone, batched))
        })
        .await??;
        serve.shutdown().await?;
        anyhow::Ok(measured)
    })?;
    let (nimbus, alone, batched) = nimbus;
    println!("serve_echo_c1_p50_ms: {:.3} ms", alone.p50_ms);
    println!("serve_echo_batched_c1_p50_ms: {:.3} ms", batched.p50_ms);
    println!("serve_echo_rps: {:.0} req/s", nimbus.rps);
    println!("serve_echo_p50_ms: {:.2} ms", nimbus.p50_ms);
    println!("serve_echo_p99_ms: {:.2} ms", nimbus.p99_ms);
    let mut summary = format!(
        "summary: serve_echo_rps={:.0} serve_echo_p50_ms={:.2} serve_echo_p99_ms={:.2}",
        nimbus.rps, nimbus.p50_ms, nimbus.p99_ms
    );
    if let Some(python) = &args.ray {
        let ray = measure_ray(python, &args)?;
        println!("ray_serve_echo_rps: {:.0} req/s", ray.rps);
        println!("ray_serve_echo_p50_ms: {:.2} ms", ray.p50_ms);
        println!("ray_serve_echo_p99_ms: {:.2} ms", ray.p99_ms);
        let (rps_ratio, p99_ratio) = (nimbus.rps / ray.rps, nimbus.p99_ms / ray.p99_ms);
        println!("serve_echo_rps_ratio: {rps_ratio:.1} x");
        println!("serve_echo_p99_ratio: {p99_ratio:.3} x");
        summary += &format!(
            " ray_serve_echo_rps={:.0} ray_serve_echo_p99_ms={:.2} rps_ratio={rps_ratio:.1} p99_ratio={p99_ratio:.3}",
            ray.rps, ray.p99_ms
        );
    }
    println!("{summary}");
    Ok(())
}

/// Ray Serve's echo, started by `ray_serve_echo.py`, measured, stopped.
fn measure_ray(python: &PathBuf, args: &Args) -> Result<Measured> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/ray_serve_echo.py");
    let mut ray = Command::new(python)
        .arg(&script)
        .arg(args.ray_port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", python.display()))?;
    let stdout = ray.stdout.take().context("Ray's stdout")?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.trim() == "ready");
        let _ = ready_tx.send(ready);
    });
    let measured = match ready_rx.recv_timeout(Duration::from_secs(180)) {
        Ok(true) => measure(
            &format!("http://127.0.0.1:{}/echo", args.ray_port),
            args.seconds,
            args.connections,
            args.threads,
        ),
        Ok(false) => Err(anyhow::anyhow!(
            "Ray Serve ended before serving (see its output above)"
        )),
        Err(_) => Err(anyhow::anyhow!("Ray Serve did not serve within 180 s")),
    };
    // Closing its stdin ends it (serve.shutdown, ray.shutdown).
    drop(ray.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(60);
    while ray.try_wait()?.is_none() {
        if Instant::now() > deadline {
            ray.kill()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    measured
}

/// A 2 s warm-up, then wrk for `seconds`.
fn measure(url: &str, seconds: u64, connections: u32, threads: u32) -> Result<Measured> {
    run_wrk(url, 2, connections, threads)?;
    let output = run_wrk(url, seconds, connections, threads)?;
    std::io::stdout().flush()?;
    parse_wrk(&output).with_context(|| format!("wrk's output did not parse:\n{output}"))
}

fn run_wrk(url: &str, seconds: u64, connections: u32, threads: u32) -> Result<String> {
    let output = Command::new("wrk")
        .args([
            format!("-t{threads}"),
            format!("-c{connections}"),
            format!("-d{seconds}s"),
            "--latency".into(),
            url.into(),
        ])
        .output()
        .context("cannot run wrk")?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    ensure!(
        output.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    if let Some(line) = text.lines().find(|line| line.contains("Non-2xx")) {
        bail!("{url} answered errors under load: {line}");
    }
    Ok(text)
}

fn parse_wrk(output: &str) -> Option<Measured> {
    let field = |prefix: &str| {
        output
            .lines()
            .map(str::trim)
            .find_map(|line| line.strip_prefix(prefix))
            .map(str::trim)
    };
    Some(Measured {
        rps: field("Requests/sec:")?.parse().ok()?,
        p50_ms: millis(field("50%")?)?,
        p99_ms: millis(field("99%")?)?,
    })
}

/// wrk's durations: `812.00us`, `1.23ms`, `2.01s`.
fn millis(text: &str) -> Option<f64> {
    let split = text.find(|c: char| c.is_ascii_alphabetic())?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    Some(match unit {
        "us" => number / 1000.0,
        "ms" => number,
        "s" => number * 1000.0,
        "m" => number * 60_000.0,
        _ => return None,
    })
}
