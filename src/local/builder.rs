//! `LocalClusterBuilder`: what a local cluster starts with.

use std::path::PathBuf;
use std::time::Duration;

use super::program::find_program;
use super::{LocalCluster, LocalClusterError};
use crate::transport::JoinToken;

/// Settings of a [`LocalCluster`].
#[derive(Clone, Debug)]
pub struct LocalClusterBuilder {
    pub(super) nodes: usize,
    pub(super) program: Option<PathBuf>,
    pub(super) program_args: Vec<String>,
    pub(super) this_program: bool,
    pub(super) heartbeat_timeout: Duration,
    pub(super) start_timeout: Duration,
    pub(super) env: Vec<(String, String)>,
    pub(super) dashboard: bool,
}

impl LocalClusterBuilder {
    /// Serve the head's dashboard (127.0.0.1, any free port, its secret):
    /// none unless asked, as every user of the machine reaches its port.
    pub fn dashboard(mut self, serve: bool) -> Self {
        self.dashboard = serve;
        self
    }

    /// Number of nodes, the head included (at least 1).
    pub fn nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes.max(1);
        self
    }

    /// The `nimbus` binary to run (default: `$NIMBUS_BIN`, else next to
    /// the current executable or one directory up, else on `PATH`).
    pub fn program(mut self, program: impl Into<PathBuf>) -> Self {
        self.program = Some(program.into());
        self
    }

    /// Arguments before `nimbus`'s own on [`LocalClusterBuilder::program`]'s
    /// command line: [`crate::runtime::NODE_ARG`] for a program of nimbus's that runs the
    /// `nimbus` command line in that role.
    pub fn program_args(mut self, args: Vec<String>) -> Self {
        self.program_args = args;
        self
    }

    /// Lets the nodes run as this very program, with [`crate::runtime::NODE_ARG`] first,
    /// when no `nimbus` binary is set (`$NIMBUS_BIN`) or beside it: for a
    /// program that calls `nimbus::init`, which then runs the `nimbus`
    /// command line (`nimbus::cli`). Ahead of `PATH`, where another
    /// version of nimbus may be.
    pub fn or_this_program(mut self) -> Self {
        self.this_program = true;
        self
    }

    /// The head's heartbeat timeout.
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    /// An environment variable for every node process (fault plans).
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_string(), value.into()));
        self
    }

    /// Starts the cluster and waits until every node is up.
    pub fn start(self) -> Result<LocalCluster, LocalClusterError> {
        let (program, program_args) = match self.program.clone() {
            Some(program) => (program, self.program_args.clone()),
            None => find_program(self.this_program)?,
        };
        let home = tempfile::Builder::new()
            .prefix("nimbus-local-")
            .tempdir()
            .map_err(|cause| LocalClusterError::Process {
                name: "head".into(),
                cause,
            })?;
        let mut cluster = LocalCluster {
            program,
            program_args,
            home,
            settings: self.clone(),
            address: ([127, 0, 0, 1], 0).into(),
            token: JoinToken::generate(),
            nodes: Vec::new(),
            spawned: 0,
        };
        let mut head_args = vec![
            "--head".to_string(),
            "--port".into(),
            "0".into(),
            "--heartbeat-timeout-ms".into(),
            self.heartbeat_timeout.as_millis().to_string(),
        ];
        match self.dashboard {
            true => head_args.extend(["--dashboard-port".into(), "0".into()]),
            false => head_args.push("--no-dashboard".into()),
        }
        let head = cluster.spawn("head", head_args, &[], true, &[])?;
        cluster.address = head.address;
        cluster.nodes.push(head);
        for _ in 1..self.nodes {
            cluster.add_node(&[])?;
        }
        Ok(cluster)
    }
}
