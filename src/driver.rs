//! The entry point of a user program: [`init`] as the first line of `main`.
//!
//! The same binary runs everywhere, as with MPI or torchrun:
//! - started by a node manager with the `nimbus-worker` argument, `init`
//!   hosts one actor and never returns;
//! - otherwise the program is a driver: with `--address HOST:PORT` (or
//!   `NIMBUS_ADDRESS`) it joins that cluster, with the token from
//!   `--token-file` (private: mode 0600), `--token` (visible to local users
//!   in the process list; warned), `NIMBUS_TOKEN` or this machine's token
//!   file; with neither it joins the head started on this machine with
//!   `nimbus start --head` if one answers (unless
//!   [`ClusterChoice::Private`]), else it starts a local cluster of its
//!   own, stopped when the [`Driver`] is dropped.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::client::{self, ClientError};
use crate::cluster::BinaryId;
use crate::cluster::{
    JobRequest, MembershipReply, MembershipRequest, WorkerReply, WorkerRequest, DRIVER_BEAT,
};
use crate::host::sha256_file;
use crate::local::{LocalCluster, LocalClusterError};
use crate::node::default_state_dir;
use crate::runtime::{ProcessContext, ProcessRole, Registry};
use crate::transport::{
    CredentialError, Credentials, Endpoint, EndpointError, JoinToken, TransportConfig,
};
use crate::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};

/// Why a driver could not start.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The local cluster did not start.
    #[error(transparent)]
    LocalCluster(#[from] LocalClusterError),
    /// No usable token.
    #[error("no cluster token: {0}")]
    Token(String),
    /// `NIMBUS_JOB_ID` cannot name a job.
    #[error("NIMBUS_JOB_ID {0:?} is malformed: 1 to 64 letters, digits, '-' or '_'")]
    JobId(String),
    /// The `--token-file` is unreadable or not private.
    #[error(transparent)]
    TokenFile(#[from] crate::host::files::TokenFileError),
    /// The token is malformed.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// This program's binary cannot be read (it is shipped to the nodes).
    #[error("cannot read this program's binary: {0}")]
    Binary(#[source] std::io::Error),
    /// The endpoint could not start.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The head could not be reached.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// `NIMBUS_PACKET_FAULTS` holds no valid plan.
    #[error(transparent)]
    FaultPlan(#[from] crate::transport::FaultPlanError),
    /// `connect` ran twice in this process.
    #[error("this process is connected to a cluster already")]
    AlreadyConnected,
    /// The driver could not make itself undumpable.
    #[error("cannot keep the cluster token from this user's other processes (prctl PR_SET_DUMPABLE): {0}")]
    Undumpable(#[source] std::io::Error),
}

/// Settings of [`init_with`].
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Nodes of the local cluster started when the program starts one.
    pub local_nodes: usize,
    /// Whether the driver shows what its job's actors print (Ray's
    /// `log_to_driver`; also off with `--no-log-to-driver` or
    /// `NIMBUS_LOG_TO_DRIVER=0`).
    pub log_to_driver: bool,
    /// Which cluster a program given no address joins.
    pub cluster: ClusterChoice,
    /// The cluster flags as the program's own parser read them
    /// ([`init_parsed`] sets them); `None`: `init` reads them from the
    /// command line itself, the one place it does
    /// ([`ClusterArgs::from_command_line`]).
    pub args: Option<ClusterArgs>,
}

/// Which cluster a driver given no `--address` (nor `NIMBUS_ADDRESS`)
/// joins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClusterChoice {
    /// The head started on this machine with `nimbus start --head` (its
    /// address in `$NIMBUS_HOME/head.json`), if it answers within
    /// [`LOCAL_HEAD_PROBE`]; else a private local cluster. Ray's
    /// `ray.init()`.
    #[default]
    LocalHeadFirst,
    /// Always a private local cluster of its own, stopped with the
    /// driver (tests and benchmarks that need a known topology).
    Private,
}

/// How long `init` waits for an answer from the head recorded on this
/// machine before it starts a private cluster instead.
pub const LOCAL_HEAD_PROBE: Duration = Duration::from_secs(2);

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            local_nodes: 1,
            log_to_driver: true,
            cluster: ClusterChoice::default(),
            args: None,
        }
    }
}

impl InitOptions {
    /// A local cluster of `default_nodes` nodes, if the program starts
    /// one, unless `--nodes N` says otherwise (as it may for any options).
    pub fn from_args(default_nodes: usize) -> Self {
        InitOptions {
            local_nodes: default_nodes,
            ..InitOptions::default()
        }
    }

    /// A private local cluster of `nodes` nodes unless an address is given,
    /// whatever runs on this machine.
    pub fn private(nodes: usize) -> Self {
        InitOptions {
            local_nodes: nodes,
            cluster: ClusterChoice::Private,
            ..InitOptions::default()
        }
    }
}

/// The command-line flags `init` reads, for a program's own clap parser
/// (`#[command(flatten)]`), so `--help` lists them and parsing accepts them.
///
/// ```
/// use clap::Parser;
/// #[derive(Parser)]
/// struct Args {
///     #[command(flatten)]
///     cluster: nimbus::ClusterArgs,
///     #[arg(long, default_value_t = 3)]
///     epochs: u32,
/// }
/// let args = Args::parse_from(["prog", "--nodes", "3", "--epochs", "5"]);
/// assert_eq!((args.cluster.nodes, args.epochs), (Some(3), 5));
/// ```
#[derive(clap::Args, Clone, Debug)]
pub struct ClusterArgs {
    /// Nodes of the local cluster started when no --address is given
    /// [default: the program's own choice].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// A running cluster's head, HOST:PORT (also NIMBUS_ADDRESS).
    #[arg(long)]
    pub address: Option<String>,
    /// The cluster's token (also NIMBUS_TOKEN); other local users can see
    /// it in the process list: prefer --token-file.
    #[arg(long)]
    pub token: Option<String>,
    /// A file holding the cluster's token (mode 0600).
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// Do not show what the job's actors print (also
    /// NIMBUS_LOG_TO_DRIVER=0).
    #[arg(long)]
    pub no_log_to_driver: bool,
}

impl ClusterArgs {
    /// The flags as a program's clap parser read them into `matches` (of a
    /// command that flattens `ClusterArgs`; one that does not has none).
    fn from_matches(matches: &clap::ArgMatches) -> Self {
        let text = |id: &str| matches.try_get_one::<String>(id).ok().flatten().cloned();
        ClusterArgs {
            nodes: matches
                .try_get_one::<usize>("nodes")
                .ok()
                .flatten()
                .copied(),
            address: text("address"),
            token: text("token"),
            token_file: matches
                .try_get_one::<PathBuf>("token_file")
                .ok()
                .flatten()
                .cloned(),
            no_log_to_driver: matches
                .try_get_one::<bool>("no_log_to_driver")
                .ok()
                .flatten()
                .is_some_and(|set| *set),
        }
    }

    /// The flags read from this process's command line by name
    /// (`--name VALUE` or `--name=VALUE`), for a program that does not
    /// parse its own ([`init`] runs before a program parses its arguments,
    /// since a worker process must never parse them); other arguments are
    /// the program's and left alone.
    pub fn from_command_line() -> Self {
        let args: Vec<String> = std::env::args().collect();
        let flag = |name: &str| {
            args.iter().enumerate().find_map(|(i, arg)| {
                if arg == name {
                    args.get(i + 1).cloned()
                } else {
                    arg.strip_prefix(&format!("{name}=")).map(str::to_string)
                }
            })
        };
        ClusterArgs {
            nodes: flag("--nodes").and_then(|n| n.parse().ok()),
            address: flag("--address"),
            token: flag("--token"),
            token_file: flag("--token-file").map(PathBuf::from),
            no_log_to_driver: args.iter().any(|arg| arg == "--no-log-to-driver"),
        }
    }
}

/// A user program's link to its cluster.
pub struct Driver {
    registry: Arc<Registry>,
    address: String,
    token: JoinToken,
    local: Option<LocalCluster>,
    binary: (PathBuf, BinaryId),
    /// The program failed: its local cluster's files are kept.
    failed: std::cell::Cell<bool>,
    /// Show what the job's actors print (`InitOptions::log_to_driver`).
    log_to_driver: bool,
}

/// [`init_with`] for a program with its own `clap` arguments `A`: in a
/// worker process it hosts the actor and never returns (a worker never
/// parses the program's arguments); in a driver it parses them first, so
/// `--help` or a bad flag exits before any cluster starts, then connects
/// with the options `options` picks.
///
/// ```no_run
/// use clap::Parser;
/// /// What this program does, for its --help.
/// #[derive(Parser)]
/// struct Args {
///     #[arg(long, default_value_t = 3)]
///     epochs: u32,
///     #[command(flatten)]
///     cluster: nimbus::ClusterArgs,
/// }
/// let (driver, args) = nimbus::init_parsed::<Args>(nimbus::actor::Registry::new(), |args| {
///     nimbus::InitOptions { local_nodes: args.cluster.nodes.unwrap_or(2), ..Default::default() }
/// })?;
/// # Ok::<(), nimbus::InitError>(())
/// ```
pub fn init_parsed<A: clap::Parser>(
    registry: Registry,
    options: impl FnOnce(&A) -> InitOptions,
) -> Result<(Driver, A), InitError> {
    let registry = registry.with_submitted();
    match ProcessRole::current() {
        ProcessRole::Worker => {
            crate::runtime::logging::install();
            crate::worker::run(crate::task::with_task_worker(registry));
        }
        ProcessRole::Node => crate::cli::run_as_node(),
        ProcessRole::Driver => {}
    }
    let matches = A::command().get_matches();
    let args = A::from_arg_matches(&matches).unwrap_or_else(|e| e.format(&mut A::command()).exit());
    let mut options = options(&args);
    options
        .args
        .get_or_insert_with(|| ClusterArgs::from_matches(&matches));
    let driver = init_with(registry, options)?;
    Ok((driver, args))
}

/// [`init_with`] with default options.
pub fn init(registry: Registry) -> Result<Driver, InitError> {
    init_with(registry, InitOptions::default())
}

/// Starts this program as a worker or a local cluster's node daemon
/// (neither returns; `runtime::ProcessRole`) or as a driver. A driver with
/// no cluster to join starts a local one whose nodes run the `nimbus`
/// binary at `$NIMBUS_BIN` or beside this program, else this program
/// itself in the node role: nothing else need be installed.
pub fn init_with(registry: Registry, options: InitOptions) -> Result<Driver, InitError> {
    let role = ProcessRole::current();
    if role == ProcessRole::Node {
        crate::cli::run_as_node();
    }
    crate::runtime::logging::install();
    let registry = crate::task::with_task_worker(registry.with_submitted());
    if role == ProcessRole::Worker {
        crate::worker::run(registry);
    }
    // A driver holds the token; the workers of every job run as the same
    // user: they must not read it from this process's memory or `/proc`.
    crate::transport::undumpable().map_err(InitError::Undumpable)?;
    let path = std::env::current_exe().map_err(InitError::Binary)?;
    let len = std::fs::metadata(&path).map_err(InitError::Binary)?.len();
    let hash = sha256_file(&path).map_err(InitError::Binary)?;
    let binary = (path, BinaryId { hash, len });
    let args = options
        .args
        .clone()
        .unwrap_or_else(ClusterArgs::from_command_line);
    let address = args
        .address
        .clone()
        .or_else(|| std::env::var("NIMBUS_ADDRESS").ok());
    let address = match (address, &options.cluster) {
        (Some(address), _) => Some(address),
        (None, ClusterChoice::LocalHeadFirst) => local_head(&args),
        (None, ClusterChoice::Private) => None,
    };
    let (address, token, local) = match address {
        Some(address) => (address, token(&args)?, None),
        None => {
            let cluster = LocalCluster::builder()
                .nodes(args.nodes.unwrap_or(options.local_nodes))
                .or_this_program()
                .start()?;
            (
                cluster.address().to_string(),
                cluster.token().clone(),
                Some(cluster),
            )
        }
    };
    Ok(Driver {
        registry: Arc::new(registry),
        address,
        token,
        local,
        binary,
        failed: std::cell::Cell::new(false),
        log_to_driver: options.log_to_driver && !args.no_log_to_driver,
    })
}

impl Driver {
    /// Connects this process to the cluster, so that actors can be spawned,
    /// found and called. Call it once, inside an async runtime that lives as
    /// long as the program uses actors.
    pub async fn connect(&self) -> Result<(), InitError> {
        if ProcessContext::current().is_some() {
            return Err(InitError::AlreadyConnected);
        }
        let name = format!("driver-{}", std::process::id());
        let me = PeerIdentity {
            role: PeerRole::Client,
            identity: NodeIdentity {
                name: name.clone(),
                incarnation: Incarnation::fresh(),
            },
        };
        let credentials = Credentials::issue(&self.token, &name)?;
        let mut transport = TransportConfig::default();
        // A program run under `nimbus chaos run` with a packet-fault plan.
        transport.packet_faults =
            crate::transport::PacketFaults::from_env().map_err(InitError::FaultPlan)?;
        let endpoint = Endpoint::client(me, &credentials, transport)?;
        let head = client::resolve(&self.address)?;
        endpoint
            .connect(head, None)
            .await
            .map_err(ClientError::from)?;
        let job = job_id()?;
        let context = ProcessContext::new(
            endpoint,
            head,
            head,
            self.registry.clone(),
            job,
            self.binary.clone(),
        );
        let context = ProcessContext::install(context).ok_or(InitError::AlreadyConnected)?;
        crate::runtime::logging::set_tags(&[("job", &context.job)]);
        crate::object_store::start(context);
        tokio::spawn(keep_job_alive(context));
        if self.log_to_driver && log_to_driver() {
            tokio::spawn(show_output(context));
        }
        crate::runtime::report_packet_faults(
            context.endpoint.clone(),
            head,
            name,
            crate::cluster::ProcessClass::Workload,
        );
        Ok(())
    }

    /// Runs a program's work on an actix system, connected first
    /// ([`connect`](Self::connect)); an error (or a panic) marks the
    /// program failed ([`mark_failed`](Self::mark_failed)).
    ///
    /// ```no_run
    /// let driver = nimbus::init(nimbus::actor::Registry::new())?;
    /// driver.block_on(async {
    ///     // spawn actors, submit tasks...
    ///     Ok::<_, anyhow::Error>(())
    /// })?;
    /// # Ok::<(), anyhow::Error>(())
    /// ```
    pub fn block_on<T, E>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E>
    where
        E: From<InitError>,
    {
        let result = actix::System::new().block_on(async {
            self.connect().await?;
            work.await
        });
        if result.is_err() {
            self.mark_failed();
        }
        result
    }

    /// Marks the program failed: when this driver ends, its local
    /// cluster's directory (node and worker logs) is kept, and where is
    /// printed, instead of removed. A panic does the same.
    pub fn mark_failed(&self) {
        self.failed.set(true);
    }

    /// The head's address.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The local cluster this driver started, if it started one.
    pub fn local_cluster(&mut self) -> Option<&mut LocalCluster> {
        self.local.as_mut()
    }
}

/// How long a driver that ends waits for the head to hear it
/// (`DriverDone`).
const DONE_WAIT: Duration = Duration::from_secs(2);

impl Drop for Driver {
    /// A failed program's local cluster keeps its files (and says where).
    /// A driver attached to a cluster tells the head its job is over, so
    /// its actors go now rather than after the grace period (`crate::head`'s
    /// `jobs.rs`, attached step 3); on a connection of its own, on a thread
    /// of its own (the program's runtime may be gone), for at most
    /// `DONE_WAIT` (2 s).
    fn drop(&mut self) {
        let failed = self.failed.get() || std::thread::panicking();
        if let (true, Some(local)) = (failed, self.local.as_mut()) {
            let dir = local.keep_files();
            eprintln!(
                "nimbus: the program failed; its local cluster's files (node and worker logs) are kept in {}",
                dir.display()
            );
        }
        let Some(context) = ProcessContext::current() else {
            return;
        };
        if let Some(local) = self.local.take() {
            // Its cluster stopped, the job is over: the directory where its
            // processes shared memory goes, if empty (a job of an attached
            // driver: when the head ends it).
            drop(local);
            let shm = std::path::Path::new(crate::host::shared_memory::SHM);
            crate::host::shared_memory::remove_if_empty(shm, &context.job);
            return;
        }
        let request = JobRequest::DriverDone {
            job: context.job.clone(),
            ok: !std::thread::panicking(),
        };
        // The task states not reported yet go first, the metrics recorded
        // since the last push, and the packet faults injected since the
        // last report (under a chaos plan).
        let tasks = crate::task::records::take_unreported(context);
        let metrics = context.metrics_push();
        let process = context.endpoint.identity().identity.name.clone();
        let packets = crate::runtime::packet_report(
            &context.endpoint,
            &process,
            crate::cluster::ProcessClass::Workload,
        );
        let (address, token) = (self.address.clone(), self.token.clone());
        let told = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let tell = async {
                    let client = client::ClusterClient::connect(&address, &token).await?;
                    for batch in tasks.chunks(crate::cluster::MAX_TASK_STATES) {
                        let states = JobRequest::TaskStates(batch.to_vec());
                        client.call(states).await?;
                    }
                    client.call(metrics).await?;
                    if let Some((_, report)) = &packets {
                        client.call(report.clone()).await?;
                    }
                    client.call(request).await
                };
                match tokio::time::timeout(DONE_WAIT, tell).await {
                    Ok(told) => told.map(drop).map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {DONE_WAIT:?}")),
                }
            })
        });
        if let Ok(Err(e)) = told.join() {
            tracing::warn!("cannot tell the head this driver's job is over ({e}); it ends after the head's --driver-grace-s");
        }
    }
}

/// The address of the head started on this machine, if one is recorded
/// and answers within [`LOCAL_HEAD_PROBE`] (asked on a thread of its own:
/// `init` may run inside a program's async runtime).
fn local_head(args: &ClusterArgs) -> Option<String> {
    let record = crate::host::files::load_head_record()?;
    let token = token(args).ok()?;
    let address = record.address.clone();
    let probe = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            let config = TransportConfig {
                connect_timeout: LOCAL_HEAD_PROBE,
                ..TransportConfig::default()
            };
            let status = async {
                client::ClusterClient::connect_with(&address, &token, config)
                    .await?
                    .status()
                    .await
            };
            match tokio::time::timeout(LOCAL_HEAD_PROBE, status).await {
                Ok(answered) => answered.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer within {LOCAL_HEAD_PROBE:?}")),
            }
        })
    });
    match probe.join() {
        Ok(Ok(_)) => {
            tracing::info!(address = %record.address, "joining the head started on this machine (nimbus start --head)");
            Some(record.address)
        }
        Ok(Err(e)) => {
            tracing::warn!(
                "{} records a head at {} that does not answer ({e}); starting a private local cluster (nimbus stop clears the record)",
                crate::host::files::head_record_path().display(),
                record.address
            );
            None
        }
        Err(_) => None,
    }
}

/// This driver's job: `NIMBUS_JOB_ID` when the cluster started it
/// (`nimbus job submit`), else a new one.
fn job_id() -> Result<String, InitError> {
    match std::env::var("NIMBUS_JOB_ID") {
        Ok(id) if crate::cluster::valid_job_id(&id) => Ok(id),
        Ok(id) => Err(InitError::JobId(id)),
        Err(_) => Ok(format!("{:08x}", rand::random::<u32>())),
    }
}

/// Tells the head, every `DRIVER_BEAT`, that this driver's job is alive
/// (`crate::head::jobs`): once it is silent for the head's grace period,
/// the job's actors are killed and its placement groups released.
async fn keep_job_alive(context: &'static ProcessContext) {
    let job = context.job.clone();
    let entrypoint: Vec<String> = std::env::args().collect();
    let request = JobRequest::DriverAlive {
        job: job.clone(),
        entrypoint: crate::cluster::bounded_text(entrypoint.join(" ")),
        versions: Some(crate::cluster::Versions::here()),
    };
    let mut beat = tokio::time::interval(DRIVER_BEAT);
    let mut told = false;
    loop {
        beat.tick().await;
        match context.call_head(request.clone()).await {
            Ok(_) => told = false,
            Err(e) if !told => {
                tracing::warn!(%job, "cannot tell the head this job is alive: {e}");
                told = true;
            }
            Err(_) => {}
        }
    }
}

/// Whether the environment lets this driver show what its job's workers
/// print: yes unless `NIMBUS_LOG_TO_DRIVER=0` (the flag is
/// `ClusterArgs::no_log_to_driver`).
fn log_to_driver() -> bool {
    !std::env::var("NIMBUS_LOG_TO_DRIVER").is_ok_and(|v| v == "0")
}

/// How often the driver reads what its job's workers printed.
const OUTPUT_POLL: Duration = Duration::from_millis(250);

/// Shows on stderr what this job's workers print to stdout, prefixed with
/// the actor and its node (`(account-1 on node-2) ...`), as Ray's
/// `log_to_driver` does: every `OUTPUT_POLL` it reads each live node's new
/// lines of this job (`ReadOutput`; a node restarted with a new
/// incarnation is read from its start).
async fn show_output(context: &'static ProcessContext) {
    let job = context.job.clone();
    let mut read: HashMap<(String, u64), u64> = HashMap::new();
    let mut tick = tokio::time::interval(OUTPUT_POLL);
    loop {
        tick.tick().await;
        let Ok(MembershipReply::Status(status)) =
            context.call_head(MembershipRequest::Status).await
        else {
            continue;
        };
        for node in status.alive() {
            let key = (node.id.clone(), node.incarnation);
            let after = read.get(&key).copied().unwrap_or(0);
            let request = WorkerRequest::ReadOutput {
                job: job.clone(),
                after,
                max: 1000,
            };
            let Ok(connection) = context
                .endpoint
                .connect(node.address, Some(&node.identity()))
                .await
            else {
                continue;
            };
            let options = crate::transport::RequestOptions::control();
            let Ok(WorkerReply::Output { lines, dropped }) =
                client::call(&connection, request, options).await
            else {
                continue;
            };
            let mut err = std::io::stderr().lock();
            if dropped > 0 {
                let _ = writeln!(
                    err,
                    "({} lines of {} not shown: the node keeps the last 10,000)",
                    dropped, node.id
                );
            }
            for line in &lines {
                let who = line
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("actor {}", line.actor));
                let _ = writeln!(err, "({who} on {}) {}", node.id, line.line);
            }
            if let Some(last) = lines.last() {
                read.insert(key, last.seq);
            }
        }
    }
}

fn token(args: &ClusterArgs) -> Result<JoinToken, InitError> {
    if let Some(file) = &args.token_file {
        let text = crate::host::files::read_token_file(file)?;
        return Ok(text.parse()?);
    }
    let typed = args.token.clone();
    if typed.is_some() {
        tracing::warn!("--token puts the cluster's token in this program's arguments, which every local user can read while it runs; prefer --token-file PATH (mode 0600) or NIMBUS_TOKEN");
    }
    let text = match typed.or_else(|| std::env::var("NIMBUS_TOKEN").ok()) {
        Some(token) => token,
        None => {
            let file = default_state_dir().join("token");
            std::fs::read_to_string(&file).map_err(|e| {
                InitError::Token(format!(
                    "no --token-file, --token or NIMBUS_TOKEN, and {} unreadable: {e}",
                    file.display()
                ))
            })?
        }
    };
    Ok(text.parse()?)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::ClusterArgs;

    /// A program's own arguments, with the cluster's flattened in.
    #[derive(Parser)]
    struct WithCluster {
        #[arg(long, default_value_t = 1)]
        epochs: u32,
        #[command(flatten)]
        cluster: ClusterArgs,
    }

    /// A program's own arguments, without them.
    #[derive(Parser)]
    struct Without {
        #[arg(long, default_value_t = 1)]
        epochs: u32,
    }

    #[test]
    fn the_cluster_flags_are_read_from_the_programs_own_parse() {
        let argv = [
            "prog",
            "--epochs",
            "5",
            "--nodes",
            "3",
            "--address=10.0.0.1:6379",
            "--token-file",
            "/tmp/t",
            "--no-log-to-driver",
        ];
        let matches = WithCluster::command().get_matches_from(argv);
        let parsed = WithCluster::from_arg_matches(&matches).unwrap();
        let read = ClusterArgs::from_matches(&matches);
        assert_eq!(parsed.epochs, 5);
        assert_eq!(read.nodes, Some(3));
        assert_eq!(read.address.as_deref(), Some("10.0.0.1:6379"));
        assert_eq!(read.token_file, Some("/tmp/t".into()));
        assert!(read.no_log_to_driver);
        assert_eq!(read.token, parsed.cluster.token);

        let matches = Without::command().get_matches_from(["prog", "--epochs", "2"]);
        assert_eq!(Without::from_arg_matches(&matches).unwrap().epochs, 2);
        let none = ClusterArgs::from_matches(&matches);
        assert_eq!(
            (none.nodes, none.address, none.no_log_to_driver),
            (None, None, false)
        );
    }
}
