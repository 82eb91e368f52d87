//! Node processes of this machine: whether a pid is still a nimbus node
//! (pids are recycled), and stopping one, gracefully first (`nimbus
//! stop`, `nimbus down`, the autoscaler's local provider).

use std::time::{Duration, Instant};

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
    let pid = pid as libc::pid_t;
    if !timeout.is_zero() {
        // SAFETY: kill() with a valid signal number has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Gone once the kernel has reaped it (its ports and files are free).
    let deadline = Instant::now() + KILL_WAIT;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    false
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
