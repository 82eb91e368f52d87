//! Which kind of process this is, decided in one place: a worker (started
//! by a node with [`WORKER_ARG`]), a node daemon run from a user's program
//! (started with [`NODE_ARG`]: the program runs the `nimbus` command line),
//! or a driver (anything else that runs `nimbus::init`).

use super::boot::WORKER_ARG;

/// The first argument that makes a program built on nimbus run the
/// `nimbus` command line instead of its own `main` (`PROGRAM nimbus-node
/// start --head --block`): a local cluster's nodes run so from the
/// driver's own binary when no `nimbus` binary is set or beside it.
pub const NODE_ARG: &str = "nimbus-node";

/// The registered name of the actor that runs tasks (`crate::task`): its
/// worker process owns no actor it spawns (a task's worker is returned
/// when idle; the actors a task spawns live as long as their job).
pub const TASK_WORKER: &str = "nimbus.TaskWorker";

/// The kind of nimbus process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessRole {
    /// A user program's main process.
    Driver,
    /// A process a node started to host one actor.
    Worker,
    /// A user's program running the `nimbus` command line (a local
    /// cluster's node daemon).
    Node,
}

impl ProcessRole {
    /// This process's role, from its command line.
    pub fn current() -> Self {
        match std::env::args().nth(1).as_deref() {
            Some(WORKER_ARG) => ProcessRole::Worker,
            Some(NODE_ARG) => ProcessRole::Node,
            _ => ProcessRole::Driver,
        }
    }

    /// `"driver"`, `"worker"` or `"node"`.
    pub fn label(self) -> &'static str {
        match self {
            ProcessRole::Driver => "driver",
            ProcessRole::Worker => "worker",
            ProcessRole::Node => "node",
        }
    }
}
