//! `nimbus stop`: stop the node processes this machine started.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;

use super::state;

/// Options of `nimbus stop`.
#[derive(Args)]
pub(crate) struct StopArgs {
    /// Seconds to wait for a graceful stop before killing.
    #[arg(long, default_value_t = 10)]
    timeout_s: u64,
    /// Kill at once (SIGKILL), without a graceful stop; as `ray stop
    /// --force`.
    #[arg(long)]
    force: bool,
}

/// Runs `nimbus stop`: SIGTERM to every recorded node, SIGKILL to those
/// still running after the timeout (at once with `--force`).
pub(crate) fn run(args: StopArgs) -> Result<()> {
    let nodes = state::load_nodes();
    let mut stopped = 0;
    for (path, node) in nodes {
        if is_nimbus_node(node.pid) {
            let grace = match args.force {
                true => Duration::ZERO,
                false => Duration::from_secs(args.timeout_s),
            };
            let graceful = terminate(node.pid, grace);
            let how = if graceful { "stopped" } else { "killed" };
            println!("{how} node {} (pid {})", node.name, node.pid);
            stopped += 1;
        }
        let _ = std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(crate::cluster::files::head_record_path());
    println!("stopped {stopped} node(s)");
    Ok(())
}

/// Whether `pid` is still a nimbus node process (pids are recycled).
fn is_nimbus_node(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|cmdline| {
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.contains(&b"start".as_slice()) && args.contains(&b"--block".as_slice())
        })
        .unwrap_or(false)
}

/// SIGTERM, then SIGKILL after `timeout` (at once when it is zero); true
/// if it exited on SIGTERM.
fn terminate(pid: u32, timeout: Duration) -> bool {
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
const KILL_WAIT: Duration = Duration::from_secs(5);

fn alive(pid: libc::pid_t) -> bool {
    // A zombie still answers kill(pid, 0); its /proc state is 'Z'.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie_or_gone = state
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .is_none_or(|s| s == "Z" || s == "X");
    !zombie_or_gone
}
