//! Processes a test must not leave behind: watch a cluster's node and
//! worker processes before it is dropped, then wait for every one of them
//! to be gone, with a deadline.
//!
//! ```no_run
//! # fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let cluster = nimbus::local::LocalCluster::start(2)?;
//! // ... the test ...
//! let watch = nimbus::testing::ExitWatch::cluster(&cluster);
//! drop(cluster);
//! watch.wait(Duration::from_secs(10))?;
//! # Ok(()) }
//! ```

use std::time::{Duration, Instant};

use crate::local::{LocalCluster, PidFd};

/// Processes left running after their test.
#[derive(Debug, thiserror::Error)]
#[error("processes left running {after:?} after their test ended (now killed): {processes:?}")]
pub struct LeftBehind {
    /// `pid: command line` of each.
    pub processes: Vec<String>,
    /// How long they were given.
    pub after: Duration,
}

/// Processes whose exit is awaited (held by pidfd, so a reused pid is never
/// mistaken for one of them).
pub struct ExitWatch {
    processes: Vec<(u32, String, PidFd)>,
}

impl ExitWatch {
    /// Every process of `cluster` now: its node processes and their worker
    /// processes.
    pub fn cluster(cluster: &LocalCluster) -> Self {
        Self::of(&cluster.processes())
    }

    /// The processes `pids` (those already gone are skipped).
    pub fn of(pids: &[u32]) -> Self {
        let processes = pids
            .iter()
            .filter_map(|&pid| {
                let fd = PidFd::open(pid).ok()?;
                let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args = String::from_utf8_lossy(&args).replace('\0', " ");
                Some((pid, args.trim().to_string(), fd))
            })
            .collect();
        ExitWatch { processes }
    }

    /// Waits up to `within` for every watched process to exit; the ones
    /// still running then are SIGKILLed and reported.
    pub fn wait(self, within: Duration) -> Result<(), LeftBehind> {
        let end = Instant::now() + within;
        let mut left = Vec::new();
        for (pid, args, fd) in self.processes {
            if !fd.wait(end.saturating_duration_since(Instant::now())) {
                fd.kill();
                left.push(format!("{pid}: {args}"));
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(LeftBehind {
                processes: left,
                after: within,
            })
        }
    }
}
