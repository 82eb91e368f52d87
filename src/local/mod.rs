//! A cluster of node processes on this machine, for tests, examples and
//! benchmarks: [`LocalCluster::start`] runs a head and `n - 1` more nodes
//! (each a real `nimbus start --block` process on loopback) and stops them
//! all when dropped, even when a test panics. It waits for each node's
//! readiness line, and can kill, suspend (SIGSTOP), resume and restart
//! single nodes, for fault-injection tests.
//!
//! The nodes run the `nimbus` binary at `$NIMBUS_BIN`, else beside the
//! program (or one directory up), else, for a program that calls
//! `nimbus::init` ([`LocalClusterBuilder::or_this_program`]), the program
//! itself with [`crate::runtime::NODE_ARG`] first, else `nimbus` on `PATH`.
//!
//! ```
//! # fn main() -> Result<(), nimbus::local::LocalClusterError> {
//! // The `nimbus` binary is found at $NIMBUS_BIN, next to the program, or on PATH.
//! let cluster = nimbus::local::LocalCluster::start(2)?;
//! println!("head at {}", cluster.address());
//! assert_eq!(cluster.nodes().len(), 2);
//! # Ok(()) }
//! ```
//!
//! Children are also asked to die with the thread that started them
//! (`PR_SET_PDEATHSIG`), so a test process killed outright leaves no node
//! behind: start clusters from a thread that outlives them.
//!
//! The rooms: `builder.rs` (what a cluster starts with), `program.rs`
//! (which binary the nodes run), `processes.rs` (pid file descriptors and
//! the worker process of an actor).

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::client::{ClientError, ClusterClient};
use crate::transport::JoinToken;
use crate::wire::Incarnation;

mod builder;
mod processes;
mod program;

pub use builder::LocalClusterBuilder;
pub use processes::worker_pid;
pub(crate) use processes::PidFd;

use crate::host::processes::{signal_process, Signal};
use processes::{children, parent_of, signal};

/// Why a local cluster could not start or change.
#[derive(Debug, thiserror::Error)]
pub enum LocalClusterError {
    /// The `nimbus` binary was not found.
    #[error("cannot find the nimbus binary (looked for {0}); build it with `cargo build --bin nimbus` or set NIMBUS_BIN or put it on PATH (a program that calls nimbus::init needs none: its own binary runs the nodes)")]
    ProgramNotFound(String),
    /// A node process could not be spawned or signalled.
    #[error("node process {name}: {cause}")]
    Process {
        /// The node.
        name: String,
        /// The OS error.
        cause: std::io::Error,
    },
    /// A node exited or printed nothing usable before it was up.
    #[error("node {name} did not start: {detail}\n--- its log ---\n{log}")]
    NotStarted {
        /// The node.
        name: String,
        /// What happened.
        detail: String,
        /// The end of its log.
        log: String,
    },
    /// There is no node with that index.
    #[error("no node with index {0}")]
    NoSuchNode(usize),
}

/// A head and more nodes, each its own process, on loopback.
pub struct LocalCluster {
    program: PathBuf,
    program_args: Vec<String>,
    home: tempfile::TempDir,
    settings: LocalClusterBuilder,
    address: SocketAddr,
    token: JoinToken,
    nodes: Vec<NodeProcess>,
    spawned: usize,
}

/// One node process of a [`LocalCluster`].
pub struct NodeProcess {
    child: Child,
    name: String,
    address: SocketAddr,
    incarnation: Incarnation,
    log: PathBuf,
    args: Vec<String>,
    /// Its worker processes stopped with it, to resume with it.
    stopped_workers: Vec<libc::pid_t>,
}

impl NodeProcess {
    /// The node's name (`head`, `node-1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The incarnation it announced when it started.
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log file (the process's stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl LocalCluster {
    /// Starts `nodes` nodes (the head included) with default settings.
    pub fn start(nodes: usize) -> Result<Self, LocalClusterError> {
        Self::builder().nodes(nodes).start()
    }

    /// Settings to start a cluster with.
    pub fn builder() -> LocalClusterBuilder {
        LocalClusterBuilder {
            nodes: 1,
            program: None,
            program_args: Vec::new(),
            this_program: false,
            heartbeat_timeout: Duration::from_secs(3),
            start_timeout: Duration::from_secs(60),
            env: Vec::new(),
            dashboard: false,
        }
    }

    /// The head's address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The cluster's token.
    pub fn token(&self) -> &JoinToken {
        &self.token
    }

    /// The head's heartbeat timeout.
    pub fn heartbeat_timeout(&self) -> Duration {
        self.settings.heartbeat_timeout
    }

    /// The binary the nodes run: `nimbus`, or a program of nimbus's run
    /// with [`LocalCluster::program_args`] first.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// What comes before `nimbus`'s own arguments on [`LocalCluster::program`]'s
    /// command line: nothing for the `nimbus` binary, [`crate::runtime::NODE_ARG`] for a
    /// program that runs the nodes itself.
    pub fn program_args(&self) -> &[String] {
        &self.program_args
    }

    /// A `nimbus` command line of the nodes' program, arguments to come.
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.program_args);
        command
    }

    /// Keeps the cluster's directory (its nodes' and workers' logs) when
    /// the cluster is dropped, instead of removing it; where it is.
    pub fn keep_files(&mut self) -> &Path {
        self.home.disable_cleanup(true);
        self.home.path()
    }

    /// The state directory (`NIMBUS_HOME`) the nodes share.
    pub fn home(&self) -> &Path {
        self.home.path()
    }

    /// The node processes; index 0 is the head.
    pub fn nodes(&self) -> &[NodeProcess] {
        &self.nodes
    }

    /// Node `index`.
    pub fn node(&self, index: usize) -> Result<&NodeProcess, LocalClusterError> {
        self.nodes
            .get(index)
            .ok_or(LocalClusterError::NoSuchNode(index))
    }

    fn node_mut(&mut self, index: usize) -> Result<&mut NodeProcess, LocalClusterError> {
        self.nodes
            .get_mut(index)
            .ok_or(LocalClusterError::NoSuchNode(index))
    }

    /// A client connected to the head.
    pub async fn client(&self) -> Result<ClusterClient, ClientError> {
        ClusterClient::connect(&self.address.to_string(), &self.token).await
    }

    /// Starts one more node with extra `nimbus start` arguments; returns
    /// its index.
    pub fn add_node(&mut self, extra_args: &[&str]) -> Result<usize, LocalClusterError> {
        self.add_node_with_env(extra_args, &[])
    }

    /// [`add_node`](Self::add_node) with extra environment variables for
    /// the node process (for example a packet fault plan).
    pub fn add_node_with_env(
        &mut self,
        extra_args: &[&str],
        env: &[(&str, String)],
    ) -> Result<usize, LocalClusterError> {
        self.add(extra_args, env, &[])
    }

    /// [`add_node`](Self::add_node), for a node that sees each of `dirs` as
    /// an empty tmpfs of its own of the given size in bytes, as a node on
    /// another host sees its own disk (or its own `/dev/shm`) at a path
    /// this host also has: the node and its workers run in a mount
    /// namespace of their own (Linux; needs root). The mounts go with the
    /// last of those processes. A [`restart`](Self::restart)ed node sees
    /// this host's directories again.
    pub fn add_node_with_private_dirs(
        &mut self,
        extra_args: &[&str],
        dirs: &[(&Path, u64)],
    ) -> Result<usize, LocalClusterError> {
        self.add(extra_args, &[], dirs)
    }

    /// Starts the next node, `node-N`, joining this cluster; its index.
    fn add(
        &mut self,
        extra_args: &[&str],
        env: &[(&str, String)],
        private_dirs: &[(&Path, u64)],
    ) -> Result<usize, LocalClusterError> {
        let index = self.nodes.len();
        let name = format!("node-{index}");
        let mut args = vec![
            "--address".to_string(),
            self.address.to_string(),
            "--node-name".into(),
            name.clone(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let node = self.spawn(&name, args, env, false, private_dirs)?;
        self.nodes.push(node);
        Ok(index)
    }

    /// SIGKILLs node `index` and reaps it (nothing to do if it exited).
    pub fn kill(&mut self, index: usize) -> Result<(), LocalClusterError> {
        let node = self.node_mut(index)?;
        if let Ok(Some(_)) = node.child.try_wait() {
            return Ok(());
        }
        signal(node, Signal::CONT)?;
        let name = node.name.clone();
        let process = |cause| LocalClusterError::Process {
            name: name.clone(),
            cause,
        };
        node.child.kill().map_err(process)?;
        node.child.wait().map_err(process)?;
        Ok(())
    }

    /// SIGSTOPs node `index` and its worker processes: the whole node
    /// stalls without dying.
    pub fn suspend(&mut self, index: usize) -> Result<(), LocalClusterError> {
        let node = self.node_mut(index)?;
        signal(node, Signal::STOP)?;
        let workers = children(node.child.id() as libc::pid_t);
        for worker in &workers {
            // A worker that exited since it was listed is its stopped
            // parent's unreaped zombie, so its pid cannot have been reused.
            let _ = signal_process(*worker as u32, Signal::STOP);
        }
        node.stopped_workers.extend(workers);
        Ok(())
    }

    /// SIGCONTs node `index` and the worker processes stopped with it.
    pub fn resume(&mut self, index: usize) -> Result<(), LocalClusterError> {
        let node = self.node_mut(index)?;
        for worker in node.stopped_workers.drain(..) {
            // As in `suspend`: the node reaps its workers only once it
            // runs again, below.
            let _ = signal_process(worker as u32, Signal::CONT);
        }
        signal(node, Signal::CONT)
    }

    /// Stops every running node gracefully (SIGTERM: members leave the
    /// cluster, then the head stops), killing any that is not gone within
    /// `timeout`. Returns whether every one of them exited cleanly; nodes
    /// that had already exited are not counted.
    pub fn shutdown(mut self, timeout: Duration) -> Result<bool, LocalClusterError> {
        let mut clean = true;
        for index in (0..self.nodes.len()).rev() {
            let node = self.node_mut(index)?;
            if let Ok(Some(_)) = node.child.try_wait() {
                continue;
            }
            clean &= self.stop(index, timeout)?;
        }
        Ok(clean)
    }

    /// Stops node `index` gracefully (SIGTERM), killing it if it is not gone
    /// within `timeout`. Returns whether it exited cleanly.
    pub fn stop(&mut self, index: usize, timeout: Duration) -> Result<bool, LocalClusterError> {
        signal(self.node_mut(index)?, Signal::TERM)?;
        match self.wait_exit(index, timeout)? {
            Some(status) => Ok(status.success()),
            None => {
                self.kill(index)?;
                Ok(false)
            }
        }
    }

    /// Waits up to `timeout` for node `index` to exit by itself.
    pub fn wait_exit(
        &mut self,
        index: usize,
        timeout: Duration,
    ) -> Result<Option<ExitStatus>, LocalClusterError> {
        let node = self.node_mut(index)?;
        if let Ok(Some(status)) = node.child.try_wait() {
            return Ok(Some(status));
        }
        let name = node.name.clone();
        let pidfd = PidFd::open(node.child.id()).map_err(|cause| LocalClusterError::Process {
            name: name.clone(),
            cause,
        })?;
        if !pidfd.wait(timeout) {
            return Ok(None);
        }
        node.child
            .wait()
            .map(Some)
            .map_err(|cause| LocalClusterError::Process { name, cause })
    }

    /// Kills node `index` if it still runs and starts it again with the
    /// same name and port: the same node, as a new incarnation. The head
    /// (index 0) restarts from its store in the cluster's `NIMBUS_HOME`:
    /// the same cluster, with the same token, taking its members back.
    pub fn restart(&mut self, index: usize) -> Result<(), LocalClusterError> {
        self.kill(index)?;
        let node = &self.nodes[index];
        let mut args = node.args.clone();
        let port = node.address.port().to_string();
        // The head started on any port (0); a node restarted before
        // already carries its port.
        match args.iter().position(|a| a == "--port") {
            Some(at) => {
                if let Some(value) = args.get_mut(at + 1) {
                    *value = port;
                }
            }
            None => args.extend(["--port".to_string(), port]),
        }
        let name = node.name.clone();
        let restarted = self.spawn(&name, args, &[], index == 0, &[])?;
        self.nodes[index] = restarted;
        Ok(())
    }

    /// Every process of this cluster now: its running node processes and
    /// their worker processes.
    pub fn processes(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let me = std::process::id() as libc::pid_t;
        for node in &self.nodes {
            let pid = node.child.id() as libc::pid_t;
            // Still this process's child: not reaped, so not a reused pid.
            if parent_of(pid) == Some(me) {
                pids.push(pid as u32);
                pids.extend(children(pid).into_iter().map(|p| p as u32));
            }
        }
        pids
    }

    /// The log of node `index` so far.
    pub fn log(&self, index: usize) -> String {
        self.nodes
            .get(index)
            .and_then(|n| std::fs::read_to_string(&n.log).ok())
            .unwrap_or_default()
    }

    /// Starts `nimbus start --block` with `args` and waits for its
    /// readiness line.
    fn spawn(
        &mut self,
        name: &str,
        args: Vec<String>,
        env: &[(&str, String)],
        head: bool,
        private_dirs: &[(&Path, u64)],
    ) -> Result<NodeProcess, LocalClusterError> {
        let process = |cause| LocalClusterError::Process {
            name: name.to_string(),
            cause,
        };
        let private_dirs = private_dirs
            .iter()
            .map(|(dir, bytes)| {
                let dir = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
                Ok((dir, std::ffi::CString::new(format!("size={bytes}"))?))
            })
            .collect::<Result<Vec<_>, std::ffi::NulError>>()
            .map_err(|e| process(std::io::Error::other(e)))?;
        self.spawned += 1;
        let log = self
            .home
            .path()
            .join(format!("{name}-{}.log", self.spawned));
        let log_file = crate::host::files::private_file(&log).map_err(process)?;
        let mut command = self.command();
        command
            .arg("start")
            .arg("--block")
            .args(&args)
            .args(["--node-ip-address", "127.0.0.1"])
            .env("NIMBUS_HOME", self.home.path())
            .envs(self.settings.env.iter().map(|(key, value)| (key, value)))
            .envs(env.iter().map(|(key, value)| (key, value)))
            .env_remove("NIMBUS_TOKEN")
            .env_remove("NIMBUS_HEAD_TOKEN")
            .stdout(Stdio::piped())
            .stderr(log_file);
        if head {
            command.args(["--node-name", name]).stdin(Stdio::null());
        } else {
            // On its standard input: every local user can read a process's
            // arguments, and its user's other processes (its workers, user
            // code) its environment.
            command.arg("--token-stdin").stdin(Stdio::piped());
        }
        // SAFETY: prctl, unshare and mount are async-signal-safe system
        // calls, as pre_exec requires; the paths were allocated before.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if private_dirs.is_empty() {
                    return Ok(());
                }
                let none = std::ptr::null();
                let propagation = libc::MS_REC | libc::MS_PRIVATE;
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(none, c"/".as_ptr(), none, propagation, none.cast()) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                for (dir, size) in &private_dirs {
                    let tmpfs = c"tmpfs".as_ptr();
                    if libc::mount(tmpfs, dir.as_ptr(), tmpfs, 0, size.as_ptr().cast()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(process)?;
        if let Some(mut stdin) = child.stdin.take() {
            // Dropped at the end of the statement: the node reads one line.
            writeln!(stdin, "{}", self.token).map_err(process)?;
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| process(std::io::Error::other("the node's stdout is not piped")))?;
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = lines_tx.send(line);
            }
        });
        let not_started = |detail: String, child: &mut Child| {
            let _ = child.kill();
            let _ = child.wait();
            LocalClusterError::NotStarted {
                name: name.to_string(),
                detail,
                log: std::fs::read_to_string(&log).unwrap_or_default(),
            }
        };
        let deadline = Instant::now() + self.settings.start_timeout;
        loop {
            let line = match lines.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => line,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(not_started(
                        format!("not up within {:?}", self.settings.start_timeout),
                        &mut child,
                    ))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait().map_err(process)?;
                    return Err(not_started(format!("exited with {status}"), &mut child));
                }
            };
            if let Some(token) = line.strip_prefix("token: ") {
                match token.parse() {
                    Ok(token) => self.token = token,
                    Err(e) => {
                        return Err(not_started(format!("printed a bad token: {e}"), &mut child))
                    }
                }
            }
            if let Some(ready) = line.strip_prefix("node: ") {
                match parse_ready(ready) {
                    Some((incarnation, address)) => {
                        return Ok(NodeProcess {
                            child,
                            name: name.to_string(),
                            address,
                            incarnation,
                            log,
                            args,
                            stopped_workers: Vec::new(),
                        })
                    }
                    None => {
                        return Err(not_started(
                            format!("printed an unreadable line {line:?}"),
                            &mut child,
                        ))
                    }
                }
            }
        }
    }
}

/// How long a dropped cluster's nodes get to stop cleanly (removing their
/// shared-memory and spill files) before they are killed.
const DROP_GRACE: Duration = Duration::from_secs(3);

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = signal(node, Signal::CONT);
            let _ = signal(node, Signal::TERM);
        }
        let end = Instant::now() + DROP_GRACE;
        for node in &mut self.nodes {
            while Instant::now() < end && matches!(node.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }
}

/// Parses `NAME incarnation N address A resources ...`.
fn parse_ready(line: &str) -> Option<(Incarnation, SocketAddr)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let value = |key: &str| {
        let at = words.iter().position(|w| *w == key)?;
        words.get(at + 1).copied()
    };
    let incarnation = value("incarnation")?.parse().ok()?;
    let address = value("address")?.parse().ok()?;
    Some((Incarnation(incarnation), address))
}
