//! `nimbus stop`: stop the node processes this machine started.

use std::time::Duration;

use crate::host::processes::{is_nimbus_node, terminate};

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
    let _ = std::fs::remove_file(crate::host::files::head_record_path());
    println!("stopped {stopped} node(s)");
    Ok(())
}
