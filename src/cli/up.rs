//! `nimbus up FILE` and `nimbus down FILE`: a cluster that grows and
//! shrinks with its work, described by a cluster config
//! ([`crate::autoscaler::config`]).
//!
//! 1. `up` checks the config, starts the head as `nimbus start --head`
//!    does (in the background, with the config's port, address and head
//!    resources), then the autoscaler in the background (`nimbus up FILE
//!    --autoscaler`, its log under `$NIMBUS_HOME/logs/`), and returns once
//!    the head shows the autoscaler's first report (within
//!    [`READY_TIMEOUT`]). What it started is recorded in
//!    `$NIMBUS_HOME/autoscaler/up.json`.
//!    Run again while the head it started still runs (the autoscaler
//!    died), it starts the autoscaler alone, which adopts the nodes the
//!    one before launched.
//! 2. `down` stops the autoscaler (SIGTERM: it stops every node it
//!    launched, within `--timeout-s`), stops any launched node still
//!    recorded, then the head `up` started; nothing else.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::autoscaler::config::resource_flags;
use crate::autoscaler::{monitor, provider, ClusterConfig};
use crate::client::ClusterClient;
use crate::host::files::head_record_path;
use crate::host::processes::{alive, is_nimbus_node, terminate};

use super::{start::token_from, state};

/// How long `up` waits for the autoscaler's first report.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a head gets to stop gracefully.
const HEAD_STOP: Duration = Duration::from_secs(10);
/// The flag that runs the autoscaler itself.
const AUTOSCALER_FLAG: &str = "--autoscaler";

/// Options of `nimbus up`.
#[derive(Args)]
pub(crate) struct UpArgs {
    /// The cluster config (TOML): node types, limits, provider.
    config: PathBuf,
    /// Run the autoscaler in the foreground (what `up` starts in the background).
    #[arg(long, hide = true)]
    autoscaler: bool,
}

/// Options of `nimbus down`.
#[derive(Args)]
pub(crate) struct DownArgs {
    /// The cluster config `nimbus up` was given.
    config: PathBuf,
    /// Seconds the autoscaler has to stop its nodes before it is killed.
    #[arg(long, default_value_t = 60)]
    timeout_s: u64,
}

/// What `up` started.
#[derive(Serialize, Deserialize)]
struct UpRecord {
    config: PathBuf,
    head_pid: u32,
    autoscaler_pid: u32,
}

fn record_path() -> PathBuf {
    state::home().join("autoscaler").join("up.json")
}

fn load_record() -> Option<UpRecord> {
    serde_json::from_slice(&std::fs::read(record_path()).ok()?).ok()
}

/// Whether `pid` is still an autoscaler (pids are recycled).
fn is_autoscaler(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.contains(&b"up".as_slice()) && args.contains(&AUTOSCALER_FLAG.as_bytes())
        })
        .unwrap_or(false)
}

fn canonical(path: &Path) -> Result<PathBuf> {
    path.canonicalize()
        .with_context(|| format!("cannot read the cluster config {}", path.display()))
}

/// Runs `nimbus up`.
pub(crate) fn up(args: UpArgs) -> Result<()> {
    let path = canonical(&args.config)?;
    let config = ClusterConfig::load(&path)?;
    if args.autoscaler {
        return run_autoscaler(config);
    }
    if let Some(record) = load_record().filter(|r| is_autoscaler(r.autoscaler_pid)) {
        bail!(
            "a cluster is already up from {} (autoscaler pid {}); `nimbus down {}` first",
            record.config.display(),
            record.autoscaler_pid,
            record.config.display()
        );
    }
    // An autoscaler that died (or was killed) is started again beside the
    // head it ran with; it adopts the nodes it had launched.
    let head_pid = match load_record().filter(|r| {
        r.config == path && is_nimbus_node(r.head_pid) && alive(r.head_pid as libc::pid_t)
    }) {
        Some(record) => {
            println!(
                "the head an earlier `nimbus up` started runs (pid {}): starting the autoscaler again",
                record.head_pid
            );
            record.head_pid
        }
        None => start_head(&config)?,
    };
    let (log_path, log) = state::new_log_file("autoscaler")?;
    let exe = std::env::current_exe().context("cannot find the nimbus executable")?;
    let mut child = Command::new(exe)
        .arg("up")
        .arg(&path)
        .arg(AUTOSCALER_FLAG)
        .env_remove("NIMBUS_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the autoscaler")?;
    let record = UpRecord {
        config: path.clone(),
        head_pid,
        autoscaler_pid: child.id(),
    };
    state::write_private(&record_path(), &serde_json::to_vec(&record)?)?;
    if let Err(e) = wait_for_report() {
        let _ = child.kill();
        let _ = child.wait();
        bail!(
            "{e:#}; the head is up (pid {head_pid}: `nimbus down {}` stops it); the autoscaler's log {}:\n{}",
            path.display(),
            log_path.display(),
            state::log_tail(&log_path, 20)
        );
    }
    println!("autoscaler: pid {}, log {}", child.id(), log_path.display());
    let types: Vec<String> = config
        .node_types
        .iter()
        .map(|t| format!("{} ({}; {}..{})", t.name, t.resources, t.min, t.max))
        .collect();
    println!(
        "node types: {}; at most {} worker nodes, idle ones stopped after {} s",
        types.join(", "),
        config.max_workers,
        config.idle_timeout.as_secs()
    );
    println!(
        "`nimbus status` shows what it runs and launches; `nimbus down {}` stops it all",
        args.config.display()
    );
    Ok(())
}

/// Starts the head as `nimbus start --head` does; its pid.
fn start_head(config: &ClusterConfig) -> Result<u32> {
    let exe = std::env::current_exe().context("cannot find the nimbus executable")?;
    let mut command = Command::new(exe);
    command.args(["start", "--head"]);
    if let Some(port) = config.head.port {
        command.args(["--port", &port.to_string()]);
    }
    if let Some(ip) = config.head.node_ip_address {
        command.args(["--node-ip-address", &ip.to_string()]);
    }
    if let Some(port) = config.head.metrics_export_port {
        command.args(["--metrics-export-port", &port.to_string()]);
    }
    if let Some(resources) = &config.head.resources {
        let set = crate::autoscaler::config::resource_set(resources)
            .map_err(|problem| anyhow::anyhow!("[head] {problem}"))?;
        command.args(resource_flags(&set));
    }
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start the head")?;
    let stdout = child
        .stdout
        .take()
        .context("no output from the head's start")?;
    let mut pid = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        println!("{line}");
        if let Some(rest) = line.strip_prefix("started in the background (pid ") {
            pid = rest.split(')').next().and_then(|p| p.parse().ok());
        }
    }
    let status = child.wait()?;
    match (status.success(), pid) {
        (true, Some(pid)) => Ok(pid),
        (true, None) => bail!("the head started but did not say its pid"),
        (false, _) => bail!("the head did not start ({status})"),
    }
}

/// Waits until the head shows the autoscaler's report.
fn wait_for_report() -> Result<()> {
    let address = state::load_head()
        .context("the head did not record its address")?
        .address;
    let token = token_from(None, None)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let client = ClusterClient::connect(&address, &token).await?;
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if client.status().await?.autoscaler.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the autoscaler did not report to the head within {READY_TIMEOUT:?}");
            }
            tokio::time::sleep(crate::autoscaler::POLL_INTERVAL / 4).await;
        }
    })
}

/// The autoscaler itself, until SIGTERM or SIGINT.
fn run_autoscaler(config: ClusterConfig) -> Result<()> {
    super::init_logging();
    let address = state::load_head()
        .context("no head was started on this machine ($NIMBUS_HOME)")?
        .address;
    let token = token_from(None, None)?;
    let home = state::home();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot handle SIGTERM")?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        Ok(monitor::run(config, (address, token), &home, stop).await?)
    })
}

/// Runs `nimbus down`.
pub(crate) fn down(args: DownArgs) -> Result<()> {
    let path = canonical(&args.config)?;
    let config = ClusterConfig::load(&path)?;
    let Some(record) = load_record() else {
        bail!(
            "nothing is up from {} on this machine (no {})",
            path.display(),
            record_path().display()
        );
    };
    if record.config != path {
        bail!(
            "the cluster up on this machine is from {}, not {}",
            record.config.display(),
            path.display()
        );
    }
    if is_autoscaler(record.autoscaler_pid) {
        let graceful = terminate(record.autoscaler_pid, Duration::from_secs(args.timeout_s));
        let how = if graceful { "stopped" } else { "killed" };
        println!("{how} the autoscaler (pid {})", record.autoscaler_pid);
    }
    let provider = provider::for_config(&config, &state::home());
    for node in provider.list() {
        provider.terminate(&node.name)?;
        println!("stopped {} (left by the autoscaler)", node.name);
    }
    if is_nimbus_node(record.head_pid) && alive(record.head_pid as libc::pid_t) {
        let graceful = terminate(record.head_pid, HEAD_STOP);
        let how = if graceful { "stopped" } else { "killed" };
        println!("{how} the head (pid {})", record.head_pid);
        let _ = std::fs::remove_file(head_record_path());
    }
    let _ = std::fs::remove_file(record_path());
    Ok(())
}
