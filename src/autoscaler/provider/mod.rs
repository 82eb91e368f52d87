//! How the autoscaler starts and stops nodes: a [`NodeProvider`], with
//! one implementation per `[provider] kind` of the cluster config.
//!
//! Every node a provider launches is recorded under
//! `$NIMBUS_HOME/autoscaler/launched/NAME.json` before it starts and
//! forgotten once it is stopped, so an autoscaler started again adopts
//! the nodes the one before launched instead of launching them twice
//! (`super`'s step 1), and stops only what it launched.
//!
//! - `local.rs`: node processes on this machine (`nimbus start --block`).
//! - `command.rs`: a user's launch and terminate programs.
//! - `slurm.rs`: one `sbatch` job per node, `scancel` to stop it.
//! - `kubernetes.rs`: one pod per node (`kubectl create`), deleted to stop it.

mod command;
mod kubernetes;
mod local;
mod slurm;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::files::private_dir;
use crate::transport::JoinToken;

use super::config::{ClusterConfig, NodeType, ProviderConfig};
use super::AutoscalerError;

pub use command::CommandProvider;
pub use kubernetes::{KubernetesProvider, KubernetesSettings};
pub use local::LocalProvider;
pub use slurm::{SlurmProvider, SlurmSettings};

/// A node to start.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// Its name (`TYPE-N`).
    pub name: String,
    /// Its type.
    pub node_type: NodeType,
    /// The head it joins (HOST:PORT).
    pub head: String,
    /// The cluster's token, handed to the node on its standard input.
    pub token: JoinToken,
    /// The address nodes of this machine advertise, if the config sets one.
    pub node_ip_address: Option<std::net::IpAddr>,
}

impl LaunchSpec {
    /// The `nimbus start` arguments of the node, but for the token.
    pub fn start_args(&self) -> Vec<String> {
        let mut args = vec![
            "start".to_string(),
            "--address".into(),
            self.head.clone(),
            "--node-name".into(),
            self.name.clone(),
        ];
        if let Some(ip) = self.node_ip_address {
            args.extend(["--node-ip-address".to_string(), ip.to_string()]);
        }
        args.extend(self.node_type.start_flags());
        args
    }
}

/// Starts and stops nodes; called from blocking threads.
pub trait NodeProvider: Send + Sync {
    /// Starts `node` (returns once it is started, not once it has joined).
    fn launch(&self, node: &LaunchSpec) -> Result<(), AutoscalerError>;
    /// Stops the node `name` it launched (done when it is not running).
    fn terminate(&self, name: &str) -> Result<(), AutoscalerError>;
    /// The nodes it launched that may still run, with their types.
    fn list(&self) -> Vec<Launched>;
}

/// The provider `config` names.
pub fn for_config(config: &ClusterConfig, home: &Path) -> Box<dyn NodeProvider> {
    let records = Records::new(home);
    match &config.provider {
        ProviderConfig::Local => Box::new(LocalProvider::new(records)),
        ProviderConfig::Command {
            launch,
            terminate,
            timeout_s,
        } => Box::new(CommandProvider::new(
            records,
            (launch.clone(), terminate.clone()),
            std::time::Duration::from_secs(timeout_s.unwrap_or(command::DEFAULT_TIMEOUT_S)),
        )),
        ProviderConfig::Slurm {
            partition,
            time_limit,
            sbatch_args,
            token_file,
            nimbus,
            start_args,
            timeout_s,
        } => Box::new(SlurmProvider::new(
            records,
            SlurmSettings {
                partition: partition.clone(),
                time_limit: time_limit.clone(),
                sbatch_args: sbatch_args.clone(),
                token_file: token_file.clone(),
                nimbus: nimbus.clone().unwrap_or_else(|| "nimbus".into()),
                start_args: start_args.clone(),
                timeout: std::time::Duration::from_secs(
                    timeout_s.unwrap_or(command::DEFAULT_TIMEOUT_S),
                ),
            },
        )),
        ProviderConfig::Kubernetes {
            namespace,
            image,
            token_secret,
            kubectl,
            start_args,
            timeout_s,
        } => Box::new(KubernetesProvider::new(
            records,
            KubernetesSettings {
                kubectl: kubectl.clone().unwrap_or_else(|| "kubectl".into()),
                namespace: namespace.clone(),
                image: image.clone(),
                token_secret: token_secret
                    .clone()
                    .unwrap_or_else(|| "nimbus-token".into()),
                start_args: start_args.clone(),
                timeout: std::time::Duration::from_secs(
                    timeout_s.unwrap_or(command::DEFAULT_TIMEOUT_S),
                ),
            },
        )),
    }
}

/// A node a provider launched, as recorded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launched {
    /// Its name.
    pub name: String,
    /// Its type's name.
    pub node_type: String,
    /// Its process, when the provider started it on this machine.
    pub pid: Option<u32>,
    /// Its job, when a scheduler runs it (Slurm's job id).
    #[serde(default)]
    pub job: Option<String>,
}

impl Launched {
    /// The record of `node`, before it is started (no process, no job yet).
    pub fn of(node: &LaunchSpec) -> Self {
        Launched {
            name: node.name.clone(),
            node_type: node.node_type.name.clone(),
            pid: None,
            job: None,
        }
    }
}

/// The record files of launched nodes.
#[derive(Clone, Debug)]
pub struct Records {
    dir: PathBuf,
}

impl Records {
    /// The records under `home` (`$NIMBUS_HOME`).
    pub fn new(home: &Path) -> Self {
        Records {
            dir: home.join("autoscaler").join("launched"),
        }
    }

    /// Records `node` (before it starts).
    pub fn save(&self, node: &Launched) -> Result<(), AutoscalerError> {
        let failed = |e: std::io::Error| AutoscalerError::State {
            path: self.dir.clone(),
            detail: e.to_string(),
        };
        private_dir(&self.dir).map_err(failed)?;
        let bytes = serde_json::to_vec(node).map_err(|e| failed(std::io::Error::other(e)))?;
        let path = self.path(&node.name);
        let tmp = path.with_extension("tmp");
        crate::host::files::write_private(&tmp, &bytes).map_err(failed)?;
        std::fs::rename(&tmp, &path).map_err(failed)
    }

    /// Forgets `name`.
    pub fn remove(&self, name: &str) {
        let _ = std::fs::remove_file(self.path(name));
    }

    /// Every record (unreadable ones skipped, with a warning).
    pub fn load(&self) -> Vec<Launched> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut launched = Vec::new();
        for path in entries.filter_map(|e| Some(e.ok()?.path())) {
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(node) => launched.push(node),
                Err(e) => tracing::warn!("skipping {}: {e}", path.display()),
            }
        }
        launched.sort_by(|a: &Launched, b| a.name.cmp(&b.name));
        launched
    }

    /// The record of `name`, if any.
    pub fn get(&self, name: &str) -> Option<Launched> {
        let bytes = std::fs::read(self.path(name)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Where a node this machine runs writes its output (the directory
    /// exists once a record was saved).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.json"))
    }
}
