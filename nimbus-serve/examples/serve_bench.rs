//! nimbus Serve's request rate and latency, in the shape of issue 53's
//! Ray Serve figures (Ray Serve 2.60 on this kind of 2-core machine: echo
//! 446–496 req/s, p50 30–34 ms, p99 72 ms; the MNIST CNN 187–199 req/s,
//! p50 77–81 ms, p99 165–166 ms): an echo deployment answering
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
//! `serve_echo_p99_ms`; then the issue's MNIST CNN case: the `serve_mnist`
//! example (nimbus-train's, built beside this one) serving a `train_mnist`
//! checkpoint (`--mnist-checkpoint DIR`, or one trained for this run by the
//! `train_mnist` example for one epoch, in a directory removed after), 2
//! replicas of 0.5 CPU, libtorch on one thread, no batching, each request
//! a JSON body of 784 floats (a generated digit): `serve_mnist_rps`,
//! `serve_mnist_p50_ms`, `serve_mnist_p99_ms`. With `--ray`, Ray Serve's
//! same deployments (`ray_serve_echo.py`, and `ray_serve_mnist.py`: the
//! same CNN in PyTorch with the checkpoint's own weights) after nimbus's:
//! `ray_serve_echo_rps` and `ray_serve_mnist_rps` with their p50 and p99,
//! and the ratios `serve_echo_rps_ratio`, `serve_echo_p99_ratio`,
//! `serve_mnist_rps_ratio`, `serve_mnist_p99_ratio` (nimbus / Ray); then a
//! last `summary:` line. Ray's Python needs torch for the MNIST case.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use clap::Parser;
use nimbus::actor::Registry;
use nimbus_serve::{Application, Deployment, HandlerError, HttpOptions, RegistryExt, Serve};

/// The generated digits of the training example: the MNIST requests.
#[path = "../../nimbus-train/examples/train_mnist/data/digits.rs"]
mod digits;

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
    /// A `train_mnist` checkpoint directory for the MNIST case [default:
    /// one trained for this run].
    #[arg(long)]
    mnist_checkpoint: Option<PathBuf>,
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
                None,
            )?;
            // One connection: what batching adds when the replica is idle.
            let alone = measure(&format!("http://{address}/echo"), seconds, 1, 1, None)?;
            let batched = measure(&format!("http://{address}/batched"), seconds, 1, 1, None)?;
            anyhow::Ok((echo, alone, batched))
        })
        .await??;
        serve.shutdown().await?;
        anyhow::Ok(measured)
    })?;
    let (nimbus, alone, batched) = nimbus;
    println!("serve_echo_c1_p50_ms: {:.3} ms", alone.p50_ms);
    println!("serve_echo_batched_c1_p50_ms: {:.3} ms", batched.p50_ms);
    print_measured("serve_echo", &nimbus);
    let mnist = MnistCase::prepare(&args)?;
    let measured = mnist.measure_nimbus(&args).and_then(|nimbus_mnist| {
        print_measured("serve_mnist", &nimbus_mnist);
        ray_side(&args, &nimbus, &nimbus_mnist, &mnist)
    });
    mnist.remove();
    println!("{}", measured?);
    Ok(())
}

/// The summary line; with `--ray`, Ray Serve's same cases measured and
/// compared.
fn ray_side(
    args: &Args,
    nimbus: &Measured,
    nimbus_mnist: &Measured,
    mnist: &MnistCase,
) -> Result<String> {
    let mut summary = format!(
        "summary: serve_echo_rps={:.0} serve_echo_p99_ms={:.2} serve_mnist_rps={:.0} serve_mnist_p99_ms={:.2}",
        nimbus.rps, nimbus.p99_ms, nimbus_mnist.rps, nimbus_mnist.p99_ms
    );
    if let Some(python) = &args.ray {
        let url = format!("http://127.0.0.1:{}", args.ray_port);
        let echo = measure_ray(
            python,
            &["ray_serve_echo.py"],
            &format!("{url}/echo"),
            None,
            args,
        )?;
        summary += &compare("echo", nimbus, &echo);
        let checkpoint = mnist.checkpoint.to_str().context("the checkpoint's path")?;
        let ray_mnist = measure_ray(
            python,
            &["ray_serve_mnist.py", checkpoint],
            &format!("{url}/mnist"),
            Some(&mnist.script),
            args,
        )?;
        summary += &compare("mnist", nimbus_mnist, &ray_mnist);
    }
    Ok(summary)
}

/// Prints `{name}_rps`, `{name}_p50_ms` and `{name}_p99_ms`.
fn print_measured(name: &str, measured: &Measured) {
    println!("{name}_rps: {:.0} req/s", measured.rps);
    println!("{name}_p50_ms: {:.2} ms", measured.p50_ms);
    println!("{name}_p99_ms: {:.2} ms", measured.p99_ms);
}

/// Prints Ray's figures of case `case` and nimbus's ratios to them; the
/// summary's part.
fn compare(case: &str, nimbus: &Measured, ray: &Measured) -> String {
    print_measured(&format!("ray_serve_{case}"), ray);
    let (rps_ratio, p99_ratio) = (nimbus.rps / ray.rps, nimbus.p99_ms / ray.p99_ms);
    println!("serve_{case}_rps_ratio: {rps_ratio:.1} x");
    println!("serve_{case}_p99_ratio: {p99_ratio:.3} x");
    format!(
        " ray_serve_{case}_rps={:.0} ray_serve_{case}_p99_ms={:.2} {case}_rps_ratio={rps_ratio:.1} {case}_p99_ratio={p99_ratio:.3}",
        ray.rps, ray.p99_ms
    )
}

/// The MNIST case: a checkpoint and the wrk script that POSTs a digit.
struct MnistCase {
    checkpoint: PathBuf,
    script: PathBuf,
    /// What this run made (the trained checkpoint's run, the script).
    made: Vec<PathBuf>,
}

impl MnistCase {
    /// The checkpoint given, or one `train_mnist` trains for one epoch;
    /// the request body: the first generated digit, 784 floats in [0, 1].
    fn prepare(args: &Args) -> Result<MnistCase> {
        let scratch = std::env::temp_dir().join(format!("serve_bench-{}", std::process::id()));
        std::fs::create_dir(&scratch)
            .with_context(|| format!("cannot create {}", scratch.display()))?;
        let made = vec![scratch.clone()];
        let checkpoint = match &args.mnist_checkpoint {
            Some(dir) => std::fs::canonicalize(dir)
                .with_context(|| format!("no checkpoint directory {}", dir.display()))?,
            None => {
                let storage = scratch.join("runs");
                let out = Command::new(sibling("train_mnist")?)
                    .args(["--epochs", "1", "--storage"])
                    .arg(&storage)
                    .stderr(Stdio::inherit())
                    .output()
                    .context("cannot run train_mnist")?;
                let text = String::from_utf8_lossy(&out.stdout);
                ensure!(out.status.success(), "train_mnist failed: {text}");
                let summary = text.lines().rfind(|l| l.starts_with("summary:"));
                let dir = summary
                    .and_then(|l| {
                        l.split_whitespace()
                            .find_map(|kv| kv.strip_prefix("checkpoint="))
                    })
                    .with_context(|| format!("train_mnist printed no checkpoint: {text}"))?;
                println!("serve_mnist serves {dir} (train_mnist, one epoch)");
                PathBuf::from(dir)
            }
        };
        let (pixels, _) = digits::generate_digits(1, 0);
        let body: Vec<f32> = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
        let script = scratch.join("post.lua");
        std::fs::write(
            &script,
            format!(
                "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = \"{}\"\n",
                serde_json::to_string(&body)?
            ),
        )?;
        Ok(MnistCase {
            checkpoint,
            script,
            made,
        })
    }

    /// `serve_mnist --hold` (2 replicas, no batching) measured by wrk.
    fn measure_nimbus(&self, args: &Args) -> Result<Measured> {
        let mut command = Command::new(sibling("serve_mnist")?);
        command.arg("--checkpoint").arg(&self.checkpoint).args([
            "--port",
            "0",
            "--requests",
            "0",
            "--max-batch-size",
            "1",
            "--hold",
        ]);
        serving(
            command,
            "serve_mnist",
            |line| {
                line.starts_with("serving ")
                    .then(|| line.rsplit(' ').next().map(str::to_string))
                    .flatten()
            },
            |url| {
                measure(
                    &url,
                    args.seconds,
                    args.connections,
                    args.threads,
                    Some(&self.script),
                )
            },
        )
    }

    /// Removes what this run made.
    fn remove(&self) {
        for path in &self.made {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// The example `name` built beside this one.
fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    ensure!(
        path.exists(),
        "serve_bench runs the {name} example beside it ({}): build it (make build)",
        path.display()
    );
    Ok(path)
}

/// Runs server `command` (stdin and stdout piped) until `ready` finds its
/// address in a line of its output (within 180 s), measures it with
/// `measure`, then closes its stdin (which ends it) and waits up to 60 s
/// before killing it.
fn serving(
    mut command: Command,
    what: &str,
    ready: impl Fn(&str) -> Option<String> + Send + 'static,
    measure: impl FnOnce(String) -> Result<Measured>,
) -> Result<Measured> {
    let mut server = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {what}"))?;
    let stdout = server.stdout.take().context("the server's stdout")?;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        let url = lines.by_ref().find_map(|line| ready(line.trim()));
        let _ = ready_tx.send(url);
        // Read on: a server blocked on a full pipe would stall the measure.
        lines.for_each(drop);
    });
    let measured = match ready_rx.recv_timeout(Duration::from_secs(180)) {
        Ok(Some(url)) => measure(url),
        Ok(None) => Err(anyhow::anyhow!(
            "{what} ended before serving (see its output above)"
        )),
        Err(_) => Err(anyhow::anyhow!("{what} did not serve within 180 s")),
    };
    drop(server.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.try_wait()?.is_none() {
        if Instant::now() > deadline {
            server.kill()?;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    measured
}

/// Ray Serve started by `script` (with its arguments after the port),
/// measured at `url` (with wrk's `lua` script, if any), stopped.
fn measure_ray(
    python: &PathBuf,
    script: &[&str],
    url: &str,
    lua: Option<&Path>,
    args: &Args,
) -> Result<Measured> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut command = Command::new(python);
    command
        .arg(dir.join(script[0]))
        .arg(args.ray_port.to_string())
        .args(&script[1..]);
    let url = url.to_string();
    serving(
        command,
        &format!("Ray Serve ({})", script[0]),
        move |line| (line == "ready").then(|| url.clone()),
        |url| measure(&url, args.seconds, args.connections, args.threads, lua),
    )
}

/// A 2 s warm-up, then wrk for `seconds`.
fn measure(
    url: &str,
    seconds: u64,
    connections: u32,
    threads: u32,
    lua: Option<&Path>,
) -> Result<Measured> {
    run_wrk(url, 2, connections, threads, lua)?;
    let output = run_wrk(url, seconds, connections, threads, lua)?;
    std::io::stdout().flush()?;
    parse_wrk(&output).with_context(|| format!("wrk's output did not parse:\n{output}"))
}

fn run_wrk(
    url: &str,
    seconds: u64,
    connections: u32,
    threads: u32,
    lua: Option<&Path>,
) -> Result<String> {
    let mut wrk = Command::new("wrk");
    wrk.args([
        format!("-t{threads}"),
        format!("-c{connections}"),
        format!("-d{seconds}s"),
        "--latency".into(),
    ]);
    if let Some(lua) = lua {
        wrk.arg("-s").arg(lua);
    }
    let output = wrk.arg(url).output().context("cannot run wrk")?;
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
