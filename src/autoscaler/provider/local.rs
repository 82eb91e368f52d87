//! Node processes on this machine: `nimbus start --block` of this same
//! binary, the token on its standard input, its output in
//! `$NIMBUS_HOME/autoscaler/NAME.log`, in a process group of its own;
//! stopped with SIGTERM (it leaves the cluster), SIGKILL after
//! [`STOP_GRACE`].

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::host::files::private_log;
use crate::host::processes::{is_nimbus_node, terminate};

use super::{LaunchSpec, Launched, NodeProvider, Records};
use crate::autoscaler::AutoscalerError;

/// How long a node has to stop after SIGTERM before it is killed.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(10);

/// Node processes on this machine.
pub struct LocalProvider {
    records: Records,
    /// The processes this provider started, to reap them once they exit.
    children: Mutex<HashMap<String, Child>>,
}

impl LocalProvider {
    /// A provider keeping its records in `records`.
    pub fn new(records: Records) -> Self {
        LocalProvider {
            records,
            children: Mutex::new(HashMap::new()),
        }
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        self.children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl NodeProvider for LocalProvider {
    fn launch(&self, node: &LaunchSpec) -> Result<(), AutoscalerError> {
        let failed = |detail: String| AutoscalerError::Launch {
            node: node.name.clone(),
            detail,
        };
        let exe =
            std::env::current_exe().map_err(|e| failed(format!("cannot find nimbus: {e}")))?;
        let log_path = self.records.log_path(&node.name);
        if let Some(dir) = log_path.parent() {
            crate::host::files::private_dir(dir)
                .map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
        }
        let log = private_log(&log_path)
            .map_err(|e| failed(format!("cannot open {}: {e}", log_path.display())))?;
        let err_log = log
            .try_clone()
            .map_err(|e| failed(format!("cannot open {}: {e}", log_path.display())))?;
        let mut child = Command::new(exe)
            .args(node.start_args())
            .args(["--token-stdin", "--block"])
            .env_remove("NIMBUS_TOKEN")
            .env_remove("NIMBUS_HEAD_TOKEN")
            .stdin(Stdio::piped())
            .stdout(log)
            .stderr(err_log)
            .process_group(0)
            .spawn()
            .map_err(|e| failed(format!("cannot start the node process: {e}")))?;
        let record = Launched {
            pid: Some(child.id()),
            ..Launched::of(node)
        };
        let handed = child
            .stdin
            .take()
            .map(|mut stdin| writeln!(stdin, "{}", node.token));
        let saved = self.records.save(&record);
        if let Err(e) = saved.and(handed.unwrap_or(Ok(())).map_err(|e| failed(e.to_string()))) {
            let _ = child.kill();
            let _ = child.wait();
            self.records.remove(&node.name);
            return Err(e);
        }
        tracing::info!(
            "started {} (pid {}), its log {}",
            node.name,
            child.id(),
            log_path.display()
        );
        self.children().insert(node.name.clone(), child);
        Ok(())
    }

    fn terminate(&self, name: &str) -> Result<(), AutoscalerError> {
        let child = self.children().remove(name);
        let pid = child
            .as_ref()
            .map(Child::id)
            .or_else(|| self.records.get(name).and_then(|r| r.pid));
        if let Some(pid) = pid.filter(|pid| child.is_some() || is_nimbus_node(*pid)) {
            let graceful = terminate(pid, STOP_GRACE);
            if !graceful {
                tracing::warn!("{name} (pid {pid}) did not stop within {STOP_GRACE:?}: killed");
            }
        }
        if let Some(mut child) = child {
            let _ = child.wait();
        }
        self.records.remove(name);
        Ok(())
    }

    fn list(&self) -> Vec<Launched> {
        let mut children = self.children();
        self.records
            .load()
            .into_iter()
            .filter(|node| {
                let running = match children.get_mut(&node.name) {
                    Some(child) => matches!(child.try_wait(), Ok(None)),
                    None => node.pid.is_some_and(is_nimbus_node),
                };
                if !running {
                    children.remove(&node.name);
                    self.records.remove(&node.name);
                }
                running
            })
            .collect()
    }
}
