//! `nimbus chaos run PLAN.toml -- COMMAND...`: run a program against a
//! local cluster while a seeded fault plan is injected, then print the
//! timeline; with `--dashboard-port`, the cluster's dashboard meanwhile.

use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use crate::chaos::{self, ChaosPlan};
use crate::dashboard::{Dashboard, DashboardConfig};
use crate::local::LocalCluster;
use crate::runtime::{ProcessRole, NODE_ARG};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};

/// Options of `nimbus chaos`.
#[derive(Args)]
pub(crate) struct ChaosArgs {
    #[command(subcommand)]
    command: ChaosCommand,
}

#[derive(Subcommand)]
enum ChaosCommand {
    /// Start a local cluster, run COMMAND against it (it gets NIMBUS_ADDRESS
    /// and NIMBUS_TOKEN), inject PLAN meanwhile, and print the timeline.
    Run(RunArgs),
}

#[derive(Args)]
struct RunArgs {
    /// The fault plan (TOML).
    plan: PathBuf,
    /// Nodes of the local cluster, the head included.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// The head's heartbeat timeout in milliseconds.
    #[arg(long, default_value_t = 3000)]
    heartbeat_timeout_ms: u64,
    /// Replace the plan's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Serve the local cluster's dashboard on this port of 127.0.0.1 (0:
    /// any free port) while the command runs: its Events page shows the
    /// faults and recoveries as they happen. Its URL, with the secret it
    /// asks for, is printed on a line `dashboard: URL`; the command gets
    /// its address as NIMBUS_DASHBOARD and the secret as
    /// NIMBUS_DASHBOARD_SECRET (`Authorization: Bearer SECRET`).
    #[arg(long)]
    dashboard_port: Option<u16>,
    /// The program to run, and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Runs `nimbus chaos`.
pub(crate) fn run(args: ChaosArgs) -> Result<()> {
    let ChaosCommand::Run(args) = args.command;
    let text = std::fs::read_to_string(&args.plan)
        .with_context(|| format!("cannot read {}", args.plan.display()))?;
    let mut plan = ChaosPlan::from_toml(&text)?;
    if let Some(seed) = args.seed {
        plan.seed = seed;
    }
    // The nodes run this same executable: `nimbus`, or a program of
    // nimbus's in the node role, whose role argument they need too.
    let program = std::env::current_exe().context("cannot find the nimbus executable")?;
    let role_args = match ProcessRole::current() {
        ProcessRole::Node => vec![NODE_ARG.to_string()],
        _ => Vec::new(),
    };
    let mut builder = LocalCluster::builder()
        .program(program)
        .program_args(role_args)
        .nodes(args.nodes)
        .heartbeat_timeout(Duration::from_millis(args.heartbeat_timeout_ms));
    for (key, value) in plan.node_env() {
        builder = builder.env(key, value);
    }
    let mut cluster = builder.start()?;
    // Declared after the cluster: dropped (stopped) before it.
    let dashboard = match args.dashboard_port {
        Some(port) => {
            let config = DashboardConfig {
                port,
                ..DashboardConfig::default()
            };
            let dashboard = Dashboard::start(config, cluster.address(), cluster.token())?;
            println!("dashboard: {}", dashboard.url());
            Some(dashboard)
        }
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (status, timeline, summary) = runtime.block_on(async {
        let mut child = tokio::process::Command::new(&args.command[0])
            .args(&args.command[1..])
            .env("NIMBUS_ADDRESS", cluster.address().to_string())
            .env("NIMBUS_TOKEN", cluster.token().to_string())
            .envs(plan.workload_env())
            .envs(dashboard.iter().map(|d| ("NIMBUS_DASHBOARD", d.base_url())))
            .envs(
                dashboard
                    .iter()
                    .filter_map(|d| d.secret())
                    .map(|secret| ("NIMBUS_DASHBOARD_SECRET", secret.to_string())),
            )
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot run {:?}", args.command[0]))?;
        let stdout = child.stdout.take().context("the command's stdout")?;
        let workload = async move {
            // Passed through as it comes; the last `summary:` line is kept
            // to be printed last, after the timeline.
            let summary = echo(stdout).await;
            (child.wait().await, summary)
        };
        let ((status, summary), timeline) = chaos::run_while(&mut cluster, &plan, workload).await?;
        anyhow::Ok((status?, timeline, summary))
    })?;
    print!("{timeline}");
    let result = report(status, &plan, &timeline.missed());
    if let Some(summary) = summary {
        println!("{summary}");
    }
    result
}

/// Copies the command's output to ours; returns its last `summary:` line.
async fn echo(stdout: tokio::process::ChildStdout) -> Option<String> {
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut summary = None;
    while let Ok(Some(line)) = lines.next_line().await {
        println!("{line}");
        if line.starts_with("summary:") {
            summary = Some(line);
        }
    }
    summary
}

/// The run's outcome: the command's, and the plan's (`missed`: faults that
/// never took effect or could not be injected, recoveries that did not
/// come); on failure, how to replay the run.
fn report(status: ExitStatus, plan: &ChaosPlan, missed: &[String]) -> Result<()> {
    if status.success() && missed.is_empty() {
        println!("the command succeeded under the plan");
        return Ok(());
    }
    if !status.success() {
        println!("the command failed ({status}); replay with the same seed and plan:");
        println!("{}", plan.to_toml());
        anyhow::bail!(
            "the command failed under the chaos plan (seed {})",
            plan.seed
        )
    }
    anyhow::bail!(
        "the command succeeded, but the plan did not run as planned (seed {}): {}",
        plan.seed,
        missed.join("; ")
    )
}
