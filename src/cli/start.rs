//! `nimbus start`: run a node, in the background (default) or the foreground.
//!
//! Without `--block` the command re-executes itself with `--block` as a
//! detached process (its own process group, stderr to a log under
//! `$NIMBUS_HOME/logs/`), relays its readiness lines and returns once it
//! is up (within `START_TIMEOUT`, 60 s), or fails with the log's tail. A
//! token given on the command line or in the environment reaches the node
//! on its standard input (`--token-stdin`), never its arguments or
//! environment; the node makes itself undumpable, so its workers (user
//! code of the same user) cannot read it from `/proc`. `--head` listens on
//! port 6379 by default; `--heartbeat-timeout-ms` (head only, default
//! 3000) sets the failure detector's timeout. The head serves the
//! dashboard (`crate::dashboard`) on 127.0.0.1:8265 unless told otherwise
//! and prints its URL on a line `dashboard: URL` (on loopback with the
//! secret it asks for, also kept in `$NIMBUS_HOME/dashboard-url`, 0600). The head keeps its
//! state in `$NIMBUS_HOME/head.redb` (`crate::head::store`): started again
//! with the same `NIMBUS_HOME` and port, it is the same cluster (the same
//! token) and takes its members back; `--head-grace-s` (60 s) is how long
//! members wait for an unreachable head, and a restarted head for them.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::cluster::ResourceOverrides;
use crate::dashboard::{self, DashboardConfig, DashboardListener, TlsSource};
use crate::head::store::HeadStore;
use crate::node::{self, NodeConfig, NodeRole};
use crate::transport::{JoinToken, DEFAULT_TICKET_LIFETIME};
use anyhow::{bail, Context, Result};
use clap::Args;

use super::state;

/// Default port of the head, as Ray's.
const DEFAULT_HEAD_PORT: u16 = 6379;
/// Default heartbeat timeout of the head (Ray's users expect failures to
/// surface within seconds).
const DEFAULT_HEARTBEAT_TIMEOUT_MS: u64 = 3000;
/// How long a background start waits for the node to be up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Options of `nimbus start`.
#[derive(Args)]
pub(crate) struct StartArgs {
    /// Start the head node, which runs the control plane and creates the
    /// cluster's token (or takes the one in --token-file or
    /// $NIMBUS_HEAD_TOKEN, and then does not print it).
    #[arg(long, conflicts_with_all = ["address", "token"])]
    head: bool,
    /// Join the head at HOST:PORT.
    #[arg(long, required_unless_present = "head")]
    address: Option<String>,
    /// The token `nimbus start --head` printed. Visible to other users in the
    /// process list while this command runs: prefer --token-file or
    /// $NIMBUS_TOKEN (default: $NIMBUS_TOKEN, then the token file of a head
    /// started on this machine).
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// A file holding the token (keep it mode 0600). With --head: the
    /// cluster's token, for a head whose members were given it beforehand
    /// (a Kubernetes Secret).
    #[arg(long, value_name = "PATH", conflicts_with = "token_stdin")]
    token_file: Option<std::path::PathBuf>,
    /// Read the token from the first line of standard input (with --head:
    /// the cluster's token, as --token-file). How a background start and a
    /// local cluster hand a node its token: in neither its environment nor
    /// its arguments.
    #[arg(long, conflicts_with = "token")]
    token_stdin: bool,
    /// UDP port to listen on (head: 6379; other nodes: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// The IP other machines reach this node at (default: the default route's source address).
    #[arg(long)]
    node_ip_address: Option<IpAddr>,
    /// A stable name for this node (default: IP:PORT).
    #[arg(long)]
    node_name: Option<String>,
    /// CPUs to offer (default: detected).
    #[arg(long)]
    num_cpus: Option<f64>,
    /// GPUs to offer (default: detected).
    #[arg(long)]
    num_gpus: Option<f64>,
    /// Memory to offer, in bytes (default: detected).
    #[arg(long)]
    memory: Option<u64>,
    /// Bytes the node's object store may hold (default: 30% of its memory).
    #[arg(long)]
    object_store_memory: Option<u64>,
    /// Where the object store spills objects that do not fit in memory: the
    /// node spills into a `nimbus-NODE-PID` directory of its own inside it and
    /// removes only that one at stop (default: under the state directory).
    #[arg(long)]
    object_spill_dir: Option<std::path::PathBuf>,
    /// Abandon an object whose put sends no bytes for this many seconds: it
    /// fails for its readers and its memory is freed [default: 60].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    object_arrival_timeout_s: Option<u64>,
    /// Custom resources as a JSON object, e.g. '{"accelerator_type:H200": 1}'.
    #[arg(long)]
    resources: Option<String>,
    /// Head only: declare a node dead after this many milliseconds without a heartbeat [default: 3000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    heartbeat_timeout_ms: Option<u64>,
    /// Head only (a member ignores it): how long the tickets it signs for
    /// nodes (and, through them, workers) are valid, in seconds; each is
    /// renewed half-way through [default: 86400].
    #[arg(long, env = "NIMBUS_TICKET_LIFETIME_S", value_parser = clap::value_parser!(u64).range(2..=30 * 86_400))]
    ticket_lifetime_s: Option<u64>,
    /// Head only: end a job (kill its actors but the detached ones, release
    /// its placement groups) once its driver has not been heard from for
    /// this many seconds [default: 30].
    #[arg(long, env = "NIMBUS_DRIVER_GRACE_S", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    driver_grace_s: Option<u64>,
    /// How long the head may be unreachable (a restart) before this node
    /// gives up on it and exits; on the head: how long, after a restart,
    /// the members it knew have to come back before they are declared
    /// dead [default: 60].
    #[arg(long, env = "NIMBUS_HEAD_GRACE_S", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    head_grace_s: Option<u64>,
    /// Rotate a worker's or job driver's log once it passes this many MiB
    /// (the one before is kept as NAME.log.1) [default: 64].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    log_max_mib: Option<u64>,
    /// Head only: serve the dashboard on this port (0: any free port)
    /// [default: 8265; when that one is taken the head starts without it].
    #[arg(long)]
    dashboard_port: Option<u16>,
    /// Head only: the address the dashboard binds. Beyond loopback it
    /// serves HTTPS only (a self-signed certificate kept in
    /// $NIMBUS_HOME/dashboard-tls unless --dashboard-tls-cert) and asks for
    /// the dashboard credential (printed as `dashboard-credential:`).
    #[arg(long, default_value = "127.0.0.1")]
    dashboard_host: IpAddr,
    /// Head only: the dashboard's certificate chain, PEM, leaf first (with
    /// --dashboard-tls-key) [default: beyond loopback, a self-signed one].
    #[arg(long, value_name = "PEM", requires = "dashboard_tls_key")]
    dashboard_tls_cert: Option<PathBuf>,
    /// Head only: the private key of --dashboard-tls-cert, PEM.
    #[arg(long, value_name = "PEM", requires = "dashboard_tls_cert")]
    dashboard_tls_key: Option<PathBuf>,
    /// Head only: serve no dashboard.
    #[arg(long, conflicts_with_all = ["dashboard_port"])]
    no_dashboard: bool,
    /// Serve this node's Prometheus metrics (its own, its workers' and its
    /// drivers') on http://HOST:PORT/metrics (0: any free port), HOST the
    /// --metrics-export-host [default: none].
    #[arg(long)]
    metrics_export_port: Option<u16>,
    /// The address /metrics binds (0.0.0.0: every interface) [default:
    /// the node's own address, --node-ip-address or the one it finds].
    #[arg(long, requires = "metrics_export_port")]
    metrics_export_host: Option<IpAddr>,
    /// Carry objects between this node and others over QUIC only, never
    /// on a TLS-over-TCP bulk stream (for networks that pass this node's
    /// UDP port but not TCP to it) [default: bulk streams on TCP, the
    /// same port number when free].
    #[arg(long)]
    no_tcp_transfers: bool,
    /// What the sandbox of this node's workers must hold: `auto` (what
    /// the host allows, warning for the rest), `required` (every layer, or
    /// the node does not start) or `off` (SECURITY.md §4).
    #[arg(long, env = "NIMBUS_WORKER_SANDBOX", default_value = "auto")]
    worker_sandbox: crate::node::SandboxMode,
    /// Stay in the foreground instead of returning once the node is up.
    #[arg(long)]
    block: bool,
}

/// Runs `nimbus start`.
pub(crate) fn run(args: StartArgs) -> Result<()> {
    if !args.head && args.heartbeat_timeout_ms.is_some() {
        bail!("--heartbeat-timeout-ms is a setting of the head; give it with --head");
    }
    if !args.head && (args.dashboard_port.is_some() || args.no_dashboard) {
        bail!("the dashboard is served by the head; give --dashboard-port or --no-dashboard with --head");
    }
    if args.block {
        run_foreground(args)
    } else {
        start_background(&args)
    }
}

fn run_foreground(args: StartArgs) -> Result<()> {
    super::init_logging();
    // The node holds the token and starts workers that run user code as the
    // same user: they must not read it from this process.
    crate::transport::undumpable().context("cannot make the node process undumpable")?;
    let from_stdin = match args.token_stdin {
        true => Some(token_from_stdin()?),
        false => None,
    };
    // A head makes the cluster's token, unless it is given one (then it
    // does not print it: it may land in a log, as `kubectl logs`) or its
    // store holds one (a restart: the same token).
    let state_dir = node::default_state_dir();
    let (token, given, store) = if args.head {
        let given = match (&args.token_file, std::env::var(HEAD_TOKEN_ENV)) {
            _ if from_stdin.is_some() => from_stdin,
            (Some(file), _) => {
                let text = crate::host::files::read_token_file(file)?;
                let token = text
                    .parse()
                    .with_context(|| format!("the token in {}", file.display()))?;
                Some(token)
            }
            (None, Ok(text)) => {
                let token = text
                    .parse()
                    .with_context(|| format!("the token in {HEAD_TOKEN_ENV}"))?;
                Some(token)
            }
            (None, Err(_)) => None,
        };
        crate::host::files::own_state_dir(&state_dir)?;
        let was_given = given.is_some();
        let (token, store) = HeadStore::start(&state_dir, given)?;
        if store.restarted {
            tracing::info!(
                "the head restarts the cluster its store {} holds ({} nodes known)",
                store.store.path().display(),
                store.nodes.len()
            );
        }
        (token, was_given, Some(store))
    } else {
        let token = match from_stdin {
            Some(token) => token,
            None => token_from(args.token.as_deref(), args.token_file.as_deref())?,
        };
        (token, true, None)
    };
    let dashboard = if args.head {
        bind_dashboard(&args)?
    } else {
        None
    };
    // The worker processes this node starts run user code: they must not
    // inherit the cluster's secret (they get what they need over stdin).
    std::env::remove_var(TOKEN_ENV);
    std::env::remove_var(HEAD_TOKEN_ENV);
    let role = match (&args.address, store) {
        (_, Some(store)) => NodeRole::Head {
            heartbeat_timeout: Duration::from_millis(
                args.heartbeat_timeout_ms
                    .unwrap_or(DEFAULT_HEARTBEAT_TIMEOUT_MS),
            ),
            ticket_lifetime: args
                .ticket_lifetime_s
                .map_or(DEFAULT_TICKET_LIFETIME, Duration::from_secs),
            store,
        },
        (Some(address), None) => NodeRole::Member {
            head: crate::client::resolve(address)?,
        },
        (None, None) => bail!("a node that is not the head needs --address"),
    };
    let default_port = if args.head { DEFAULT_HEAD_PORT } else { 0 };
    let reset_key = match &role {
        NodeRole::Head { store, .. } => Some(store.reset_key.clone()),
        NodeRole::Member { .. } => None,
    };
    let mut config = NodeConfig::new(role, token.clone());
    config.state_dir = state_dir;
    config.transport.reset_key = reset_key;
    config.transport.bulk_over_tcp = !args.no_tcp_transfers;
    if let Some(seconds) = args.head_grace_s {
        config.head_grace = Duration::from_secs(seconds);
        // Its workers and submitted drivers wait for the head as long
        // (`crate::client::head_wait` reads it).
        std::env::set_var("NIMBUS_HEAD_GRACE_S", seconds.to_string());
    }
    config.listen = SocketAddr::new([0, 0, 0, 0].into(), args.port.unwrap_or(default_port));
    config.advertise_ip = args.node_ip_address;
    config.node_name = args.node_name;
    config.object_store_memory = args.object_store_memory;
    config.object_spill_dir = args.object_spill_dir.clone();
    if let Some(seconds) = args.object_arrival_timeout_s {
        config.object_arrival_timeout = std::time::Duration::from_secs(seconds);
    }
    if let Some(seconds) = args.driver_grace_s {
        config.driver_grace = Duration::from_secs(seconds);
    }
    if let Some(mib) = args.log_max_mib {
        config.log_max = mib << 20;
    }
    config.metrics_export = args.metrics_export_port;
    config.metrics_host = args.metrics_export_host;
    config.worker_sandbox = args.worker_sandbox;
    config.resources = ResourceOverrides {
        num_cpus: args.num_cpus,
        num_gpus: args.num_gpus,
        memory: args.memory,
        custom_json: args.resources,
    };
    let head = args.head;
    let mut serving = None;
    let mut record = None;
    let result = node::run(config, |ready| {
        let mut out = std::io::stdout().lock();
        if let Some(listener) = dashboard {
            match listener.serve(ready.address, &token) {
                Ok(dashboard) => {
                    // Bound to every address: show the one others reach.
                    let url = match dashboard.address() {
                        bound if bound.ip().is_unspecified() => {
                            dashboard.url_at(SocketAddr::new(ready.address.ip(), bound.port()))
                        }
                        _ => dashboard.url(),
                    };
                    if let Err(e) = state::save_dashboard_url(&url) {
                        tracing::warn!("cannot save the dashboard's URL: {e:#}");
                    }
                    let _ = writeln!(out, "dashboard: {url}");
                    if let Some(fingerprint) = dashboard.fingerprint() {
                        let _ = writeln!(out, "dashboard-certificate: SHA-256 {fingerprint}");
                    }
                    if dashboard.needs_login() {
                        let credential = token.dashboard_credential();
                        if let Err(e) = state::save_dashboard_credential(&credential) {
                            tracing::warn!("cannot save the dashboard's credential: {e:#}");
                        }
                        let _ = writeln!(out, "dashboard-credential: {credential}");
                    }
                    serving = Some(dashboard);
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
        if head {
            let address = ready.address.to_string();
            if let Err(e) = state::save_head(&address, &token.to_string()) {
                tracing::warn!("cannot save the head's address and token: {e:#}");
            }
            let _ = writeln!(out, "address: {address}");
            if !given {
                let _ = writeln!(out, "token: {token}");
            }
            let _ = writeln!(out, "token-file: {}", state::token_file().display());
        }
        if let Some(metrics) = ready.metrics {
            let _ = writeln!(out, "metrics: http://{metrics}/metrics");
        }
        let node = state::NodeRecord {
            pid: std::process::id(),
            name: ready.identity.name.clone(),
        };
        match state::save_node(&node) {
            Ok(path) => record = Some(path),
            Err(e) => tracing::warn!("cannot record this node for `nimbus stop`: {e:#}"),
        }
        let _ = writeln!(
            out,
            "node: {} incarnation {} address {} resources {}",
            ready.identity.name, ready.identity.incarnation, ready.address, ready.resources
        );
        let _ = out.flush();
    });
    drop(serving);
    if let Some(path) = record {
        let _ = std::fs::remove_file(path);
    }
    Ok(result?)
}

/// The dashboard's socket, bound before the head starts: a port given with
/// `--dashboard-port` that is taken fails the start; the default one
/// (8265) being taken only leaves the head without a dashboard (a second
/// cluster on this machine, or tests).
fn bind_dashboard(args: &StartArgs) -> Result<Option<DashboardListener>> {
    if args.no_dashboard {
        return Ok(None);
    }
    let tls = match (&args.dashboard_tls_cert, &args.dashboard_tls_key) {
        (Some(cert), Some(key)) => Some(TlsSource::Files {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ if args.dashboard_host.is_loopback() => None,
        _ => Some(TlsSource::SelfSigned {
            dir: state::home().join(dashboard::SELF_SIGNED_DIR),
            names: certificate_names(args),
        }),
    };
    let config = DashboardConfig {
        host: args.dashboard_host,
        port: args.dashboard_port.unwrap_or(dashboard::DEFAULT_PORT),
        tls,
    };
    match DashboardListener::bind(config) {
        Ok(listener) => Ok(Some(listener)),
        Err(e) if args.dashboard_port.is_none() => {
            tracing::warn!("starting without a dashboard: {e}");
            println!("dashboard: none ({e})");
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// What a self-signed dashboard certificate names: the dashboard's own
/// address (unless every address), the node's given or found one, and
/// loopback.
fn certificate_names(args: &StartArgs) -> Vec<String> {
    let node_ip = args.node_ip_address.unwrap_or_else(node::detect_ip);
    let dashboard = Some(args.dashboard_host).filter(|ip| !ip.is_unspecified());
    let mut names = Vec::new();
    for ip in [Some(node_ip), dashboard, Some(IpAddr::from([127, 0, 0, 1]))]
        .into_iter()
        .flatten()
    {
        if !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
    }
    names.push("localhost".into());
    names
}

/// Starts this same command with `--block` as a detached process, relays
/// its startup lines, and returns once it is up (or fails with its error).
///
/// A token given with `--token`, `--token-stdin` or in the environment
/// reaches the node on its standard input (`--token-stdin`), never its
/// arguments or environment: the node runs for days, every local user can
/// read a process's arguments (`ps -eo args`), and its user's other
/// processes (its workers) its environment.
fn start_background(args: &StartArgs) -> Result<()> {
    let (log_path, log) = state::new_log_file("node")?;
    let exe = std::env::current_exe().context("cannot find the nimbus executable")?;
    let handed = match (&args.token, args.token_stdin) {
        (Some(token), _) => Some(token.clone()),
        (None, true) => Some(token_from_stdin()?.to_string()),
        (None, false) if args.token_file.is_some() => None,
        (None, false) if args.head => std::env::var(HEAD_TOKEN_ENV).ok(),
        (None, false) => std::env::var(TOKEN_ENV).ok(),
    };
    let mut command = Command::new(exe);
    command
        .args(without_token(std::env::args_os().skip(1)))
        .arg("--block")
        .env_remove(TOKEN_ENV)
        .env_remove(HEAD_TOKEN_ENV);
    if handed.is_some() {
        command.arg("--token-stdin");
    }
    let mut child = command
        .stdin(match handed {
            Some(_) => Stdio::piped(),
            None => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("cannot start the node process")?;
    if let (Some(token), Some(mut stdin)) = (handed, child.stdin.take()) {
        // Dropped at the end of the statement: the node reads one line.
        writeln!(stdin, "{token}").context("cannot hand the node its token")?;
    }
    let stdout = child
        .stdout
        .take()
        .context("no stdout from the node process")?;
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                println!("{line}");
                if line.starts_with("node: ") {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait()?;
                bail!(
                    "the node failed to start ({status}); its log {}:\n{}",
                    log_path.display(),
                    state::log_tail(&log_path, 20)
                );
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the node was not up within {START_TIMEOUT:?}; see {}",
                    log_path.display()
                );
            }
        }
    }
    println!("log: {}", log_path.display());
    println!(
        "started in the background (pid {}); `nimbus status` lists the cluster, `nimbus stop` stops it",
        child.id()
    );
    Ok(())
}

/// The environment variable that carries the token.
const TOKEN_ENV: &str = "NIMBUS_TOKEN";
/// The token a head is to use instead of making one (Kubernetes: from the
/// same Secret key its members read as `NIMBUS_TOKEN`).
const HEAD_TOKEN_ENV: &str = "NIMBUS_HEAD_TOKEN";

/// The token on the first line of standard input (`--token-stdin`).
fn token_from_stdin() -> Result<JoinToken> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("cannot read the token from standard input (--token-stdin)")?;
    line.parse()
        .context("the token on standard input (--token-stdin)")
}

/// `args` without `--token VALUE`, `--token=VALUE` and `--token-stdin`.
fn without_token(
    args: impl Iterator<Item = std::ffi::OsString>,
) -> impl Iterator<Item = std::ffi::OsString> {
    let mut skip_value = false;
    args.filter(move |arg| {
        if std::mem::take(&mut skip_value) {
            return false;
        }
        let text = arg.to_string_lossy();
        if text == "--token-stdin" {
            return false;
        }
        if text == "--token" {
            skip_value = true;
            return false;
        }
        !text.starts_with("--token=")
    })
}

/// The token from `--token`, `--token-file`, `$NIMBUS_TOKEN`, or this
/// machine's token file.
pub(crate) fn token_from(arg: Option<&str>, file: Option<&std::path::Path>) -> Result<JoinToken> {
    let text = match (arg, file) {
        (Some(token), _) => {
            eprintln!("warning: --token puts the cluster's token in this command's arguments, which every local user can read while it runs; prefer --token-file PATH (mode 0600) or {TOKEN_ENV}");
            token.to_string()
        }
        (None, Some(file)) => crate::host::files::read_token_file(file)?,
        (None, None) => match std::env::var(TOKEN_ENV) {
            Ok(token) => token,
            Err(_) => std::fs::read_to_string(state::token_file()).with_context(|| {
                format!(
                    "no --token or --token-file given, {TOKEN_ENV} is not set, and {} cannot be read",
                    state::token_file().display()
                )
            })?,
        },
    };
    Ok(text.parse()?)
}
