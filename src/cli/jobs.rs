//! `nimbus job submit|list|status|logs|stop`: driver programs run on the
//! cluster, detached from the submitter's terminal (Ray's `ray job`).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::{job_row, ClusterClient, WorkingDir};
use crate::cluster::{JobRecord, JobSubmission};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use super::actors::print_table;
use super::head_args::HeadArgs;

/// What `nimbus job` does.
#[derive(Subcommand)]
pub(crate) enum JobCommand {
    /// Run a driver program on the head (or --node), detached from this
    /// terminal; prints `job: ID`, then its output until it ends, and exits
    /// with its outcome (unless --no-wait).
    Submit(SubmitArgs),
    /// Every job the head knows, live and ended.
    List(ListArgs),
    /// One job's state, node, driver and how it ended.
    Status(JobArgs),
    /// A submitted job's driver output (stdout and stderr), from its node.
    Logs(LogsArgs),
    /// Stop a job: SIGTERM to its driver, SIGKILL after 5 s, its actors
    /// killed; waits until it has stopped.
    Stop(JobArgs),
}

/// Options of `nimbus job submit`.
#[derive(Args)]
pub(crate) struct SubmitArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// A directory packed and shipped to the node; the driver runs inside
    /// it (default: an empty directory). At most 512 MiB packed; its
    /// `.git` directories and `.env`/`.env.*` files stay behind.
    #[arg(long, value_name = "DIR")]
    working_dir: Option<PathBuf>,
    /// Ship the working directory's `.git` directories and `.env` files
    /// too (left out by default: they hold credentials more often than
    /// anything a driver reads).
    #[arg(long, requires = "working_dir")]
    with_private_files: bool,
    /// An environment variable for the driver; repeat for more.
    #[arg(long, value_name = "K=V")]
    env: Vec<String>,
    /// A name to show in `nimbus job list`.
    #[arg(long)]
    name: Option<String>,
    /// The node to run the driver on (default: the head).
    #[arg(long)]
    node: Option<String>,
    /// Print the job id and return at once.
    #[arg(long)]
    no_wait: bool,
    /// The program and its arguments, after `--`. A relative path with a
    /// `/` is the working directory's; a bare name is looked up on the
    /// node's PATH.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    entrypoint: Vec<String>,
}

/// Options of `nimbus job list`.
#[derive(Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    head: HeadArgs,
    /// Print a JSON array of jobs.
    #[arg(long)]
    json: bool,
}

/// Options naming one job.
#[derive(Args)]
pub(crate) struct JobArgs {
    /// The job's id (`job: ID` of `nimbus job submit`, or `nimbus job list`).
    job: String,
    #[command(flatten)]
    head: HeadArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Options of `nimbus job logs`.
#[derive(Args)]
pub(crate) struct LogsArgs {
    /// The job's id.
    job: String,
    #[command(flatten)]
    head: HeadArgs,
    /// Keep printing until the job ends.
    #[arg(long)]
    follow: bool,
}

/// Most bytes one log read asks for.
const LOG_CHUNK: u64 = 1 << 20;
/// How often a followed log is read on while nothing new came.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);
/// How long `stop` waits for the driver to exit: the node's SIGTERM grace
/// (5 s), then SIGKILL, with room to spare.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// Runs `nimbus job ...`.
pub(crate) fn run(command: JobCommand) -> Result<()> {
    match command {
        JobCommand::Submit(args) => submit(args),
        JobCommand::List(args) => list(args),
        JobCommand::Status(args) => status(args),
        JobCommand::Logs(args) => logs(args),
        JobCommand::Stop(args) => stop(args),
    }
}

fn submit(args: SubmitArgs) -> Result<()> {
    let env = args
        .env
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {pair:?} is not K=V"))
        })
        .collect::<Result<Vec<_>>>()?;
    let program = &args.entrypoint[0];
    if args.working_dir.is_none() && program.contains('/') && !program.starts_with('/') {
        let local = std::path::absolute(program)
            .ok()
            .filter(|p| p.exists())
            .map_or(String::new(), |p| {
                format!(
                    " (on a node that sees this machine's files: {})",
                    p.display()
                )
            });
        anyhow::bail!(
            "the program {program:?} is a relative path, and without --working-dir the driver runs in an empty directory: ship its directory with --working-dir DIR (the path is then DIR's), or give an absolute path{local}"
        );
    }
    let submission = JobSubmission {
        name: args.name,
        entrypoint: args.entrypoint,
        env,
        working_dir: None,
        node: args.node,
    };
    let (working_dir, no_wait) = (args.working_dir, args.no_wait);
    let with_private = args.with_private_files;
    let ended = args.head.with_client(async |client| {
        let working_dir = working_dir
            .as_deref()
            .map(|path| WorkingDir { path, with_private });
        let job = client.submit_job(submission, working_dir).await?;
        println!("job: {}", job.id);
        std::io::stdout().flush()?;
        if no_wait {
            return Ok(None);
        }
        follow(&client, &job.id, 0).await.map(Some)
    })?;
    if let Some(job) = ended {
        eprintln!("job {} {}: {}", job.id, job.state, job.message);
        std::process::exit(job.exit_status());
    }
    Ok(())
}

/// Prints job `id`'s log from `offset` as it grows, until the job has
/// ended and all of it is printed; the job as it ended.
async fn follow(client: &ClusterClient, id: &str, mut offset: u64) -> Result<JobRecord> {
    loop {
        // The state before the read: a job that had ended then has
        // written all it will.
        let job = client.job(id).await?;
        let chunk = match client.read_job_log(&job, offset, LOG_CHUNK).await {
            Ok(chunk) => chunk,
            Err(e) if job.state.is_terminal() => {
                eprintln!("(job {id}'s log cannot be read: {e})");
                return Ok(job);
            }
            Err(e) if offset == 0 && !job.state.is_terminal() => {
                // Not started yet: no log until it runs.
                tracing::debug!("job {id}: {e}");
                tokio::time::sleep(FOLLOW_INTERVAL).await;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if chunk.total < offset {
            eprintln!("(job {id}'s log was rotated: reading it from its start)");
            offset = 0;
            continue;
        }
        if !chunk.bytes.is_empty() {
            offset += chunk.bytes.len() as u64;
            let mut out = std::io::stdout().lock();
            out.write_all(&chunk.bytes)?;
            out.flush()?;
            continue;
        }
        if job.state.is_terminal() {
            return Ok(job);
        }
        tokio::time::sleep(FOLLOW_INTERVAL).await;
    }
}

fn list(args: ListArgs) -> Result<()> {
    let jobs = args
        .head
        .with_client(async |client| Ok(client.jobs().await?))?;
    let rows: Vec<Map<String, Value>> = jobs.iter().map(job_row).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    Ok(())
}

fn status(args: JobArgs) -> Result<()> {
    let id = args.job.clone();
    let job = args
        .head
        .with_client(async |client| Ok(client.job(&id).await?))?;
    let row = job_row(&job);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&row)?);
        return Ok(());
    }
    for (key, value) in &row {
        println!("{key}: {}", super::actors::text(value));
    }
    Ok(())
}

fn logs(args: LogsArgs) -> Result<()> {
    let (id, keep) = (args.job.clone(), args.follow);
    args.head.with_client(async |client| {
        if keep {
            follow(&client, &id, 0).await?;
            return Ok(());
        }
        let job = client.job(&id).await?;
        let mut offset = 0;
        loop {
            let chunk = client.read_job_log(&job, offset, LOG_CHUNK).await?;
            let mut out = std::io::stdout().lock();
            out.write_all(&chunk.bytes)?;
            offset += chunk.bytes.len() as u64;
            if chunk.bytes.is_empty() || offset >= chunk.total {
                out.flush()?;
                return Ok(());
            }
        }
    })
}

fn stop(args: JobArgs) -> Result<()> {
    let id = args.job.clone();
    let job = args.head.with_client(async |client| {
        client.stop_job(&id).await?;
        let end = Instant::now() + STOP_WAIT;
        loop {
            let job = client.job(&id).await?;
            if job.state.is_terminal() {
                return Ok(job);
            }
            if Instant::now() > end {
                bail!(
                    "job {id} did not stop within {STOP_WAIT:?}: it is {}",
                    job.state
                );
            }
            tokio::time::sleep(FOLLOW_INTERVAL).await;
        }
    })?;
    println!("job {}: {} ({})", job.id, job.state, job.message);
    Ok(())
}
