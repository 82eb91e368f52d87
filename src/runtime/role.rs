//! Which kind of process this is, decided in one place: a worker (started
//! by a node with [`WORKER_ARG`]) or a driver (anything else that runs
//! `nimbus::init`).

use super::boot::WORKER_ARG;

/// The kind of nimbus process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessRole {
    /// A user program's main process.
    Driver,
    /// A process a node started to host one actor.
    Worker,
}

impl ProcessRole {
    /// This process's role, from its command line.
    pub fn current() -> Self {
        if std::env::args().nth(1).as_deref() == Some(WORKER_ARG) {
            ProcessRole::Worker
        } else {
            ProcessRole::Driver
        }
    }

    /// `"driver"` or `"worker"`.
    pub fn label(self) -> &'static str {
        match self {
            ProcessRole::Driver => "driver",
            ProcessRole::Worker => "worker",
        }
    }
}
