//! Node processes of this machine: whether a pid is still a nimbus node
//! (pids are recycled), and stopping one, gracefully first (`nimbus
//! stop`, `nimbus down`, the autoscaler's local provider).

use std::time::{Duration, Instant};

pub use rustix::process::Signal;
use rustix::process::{kill_process, kill_process_group, Pid};

/// Whether `pid` is still a nimbus node process (pids are recycled).
pub fn is_nimbus_node(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.contains(&b"start".as_slice()) && args.contains(&b"--block".as_slice())
        })
        .unwrap_or(false)
}

/// SIGTERM, then SIGKILL after `timeout` (at once when it is zero); true
/// if it exited on SIGTERM.
pub fn terminate(pid: u32, timeout: Duration) -> bool {
    if !timeout.is_zero() {
        let _ = signal_process(pid, Signal::TERM);
    }
    let pid = pid as libc::pid_t;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = signal_process(pid as u32, Signal::KILL);
    // Gone once the kernel has reaped it (its ports and files are free).
    let deadline = Instant::now() + KILL_WAIT;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether this process may signal process `pid` (signal 0: nothing is
/// sent).
pub fn may_signal(pid: u32) -> std::io::Result<()> {
    rustix::process::test_kill_process(single(pid)?).map_err(std::io::Error::from)
}

/// Sends `signal` to process `pid`. A pid that names no single process
/// (0, which would signal the caller's own group, or one past `i32`) is
/// refused as invalid input.
pub fn signal_process(pid: u32, signal: Signal) -> std::io::Result<()> {
    kill_process(single(pid)?, signal).map_err(std::io::Error::from)
}

/// Sends `signal` to the process group led by `leader` (refused as
/// [`signal_process`] refuses a pid).
pub fn signal_group(leader: u32, signal: Signal) -> std::io::Result<()> {
    kill_process_group(single(leader)?, signal).map_err(std::io::Error::from)
}

fn single(pid: u32) -> std::io::Result<Pid> {
    i32::try_from(pid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no single process has pid {pid}"),
            )
        })
}

/// How long a killed node may take to be gone.
pub const KILL_WAIT: Duration = Duration::from_secs(5);

/// Whether `pid` runs (not gone, not a zombie).
pub fn alive(pid: libc::pid_t) -> bool {
    // A zombie still answers kill(pid, 0); its /proc state is 'Z'.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie_or_gone = state
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .is_none_or(|s| s == "Z" || s == "X");
    !zombie_or_gone
}
