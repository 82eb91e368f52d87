//! The processes of a local cluster: pid file descriptors to kill and wait
//! for them without racing pid reuse, and the worker process hosting an
//! actor found among this process's descendants.

use std::time::Duration;

use super::{LocalClusterError, NodeProcess};
use crate::cluster::ActorId;
use crate::host::processes::{signal_process, Signal};
use crate::runtime::boot::WORKER_ARG;

/// Sends `signal` to a node that has not exited (a reaped pid may already
/// belong to another process).
pub(super) fn signal(node: &mut NodeProcess, signal: Signal) -> Result<(), LocalClusterError> {
    if let Ok(Some(_)) = node.child.try_wait() {
        return Ok(());
    }
    // The child is not yet reaped, so its pid cannot have been recycled.
    signal_process(node.child.id(), signal).map_err(|cause| LocalClusterError::Process {
        name: node.name.clone(),
        cause,
    })
}

/// A process held by a Linux pidfd: waited on with a deadline, without
/// polling, and never mistaken for a later process that reuses its pid.
pub(crate) struct PidFd(std::os::fd::OwnedFd);

impl PidFd {
    /// Holds process `pid`; fails if there is none.
    pub(crate) fn open(pid: u32) -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(PidFd(unsafe {
            std::os::fd::OwnedFd::from_raw_fd(fd as i32)
        }))
    }

    /// SIGKILLs the process (nothing if it is gone).
    pub(crate) fn kill(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: pidfd_send_signal takes a pidfd we own, a signal, a null
        // siginfo and no flags.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.0.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    /// True once the process has exited; false after `timeout`.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        use std::os::fd::AsRawFd;
        let mut poll = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut poll, 1, millis) > 0 }
    }
}

/// The processes whose parent is `parent` (from `/proc/PID/stat`).
pub(super) fn children(parent: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: libc::pid_t = entry.file_name().to_str()?.parse().ok()?;
            (parent_of(pid)? == parent).then_some(pid)
        })
        .collect()
}

/// The parent of process `pid` (from `/proc/PID/stat`), if it exists.
pub(super) fn parent_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid ...`; comm may hold spaces and parens.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

/// The pid of the worker process hosting `actor` on this machine, from
/// `/proc/*/cmdline` (`nimbus-worker --job J --actor ID`): for tests and
/// demonstrations that kill a worker the way a crash would, on a local
/// cluster (every worker runs on this machine).
pub fn worker_pid(actor: ActorId) -> Option<i32> {
    let needle = format!("--actor\0{actor}");
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline);
            (cmdline.contains(WORKER_ARG) && cmdline.contains(&needle))
                .then(|| entry.file_name().to_str()?.parse().ok())
                .flatten()
        })
}
