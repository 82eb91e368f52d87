//! The cluster config file `nimbus up FILE` reads (TOML): the head, the
//! node types the autoscaler may launch, its limits and its provider.
//!
//! ```toml
//! max_workers = 4          # worker nodes of all types together
//! idle_timeout_s = 60      # an idle node is stopped after this long
//! upscaling_speed = 1.0    # launches at once: this × the running nodes (at least 5)
//! launch_timeout_s = 120   # a launched node not joined by then has failed
//!
//! [head]
//! port = 6379
//! resources = { CPU = 0 }  # the head runs no work
//!
//! [provider]
//! kind = "local"           # or "command" (launch = [...], terminate = [...]),
//!                          # or "slurm" (token_file = "/shared/...", partition, ...)
//!
//! [node_types.cpu-2]
//! resources = { CPU = 2 }
//! min_workers = 0
//! max_workers = 2
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::cluster::{ResourceSet, CPU, GPU, MEMORY};
use crate::wire::{MAX_NODE_NAME, WORKER_NAME_PREFIX};

use super::AutoscalerError;

/// The default `idle_timeout_s`, as Ray's (`idle_timeout_minutes: 5`
/// is Ray's; a minute suits clusters of processes better).
const DEFAULT_IDLE_TIMEOUT_S: u64 = 60;
/// The default `launch_timeout_s`.
const DEFAULT_LAUNCH_TIMEOUT_S: u64 = 120;
/// The most node types a config may have.
const MAX_NODE_TYPES: usize = crate::cluster::MAX_REPORTED;

/// A cluster config file, checked.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Where it was read from.
    pub path: PathBuf,
    /// Worker nodes of all types together, at most.
    pub max_workers: u32,
    /// How long a node has nothing to do before it is stopped.
    pub idle_timeout: Duration,
    /// Launches at once: this times the running worker nodes (at least 5).
    pub upscaling_speed: f64,
    /// A launched node that has not joined by then has failed.
    pub launch_timeout: Duration,
    /// The head.
    pub head: HeadConfig,
    /// How nodes are launched and stopped.
    pub provider: ProviderConfig,
    /// The node types, by name, in name order.
    pub node_types: Vec<NodeType>,
}

/// The head `nimbus up` starts.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadConfig {
    /// Its port (6379 by default).
    pub port: Option<u16>,
    /// The address members reach it at (default: found as `nimbus start` does).
    pub node_ip_address: Option<std::net::IpAddr>,
    /// What it offers (default: what it detects); `{ CPU = 0 }` keeps
    /// work off the head.
    #[serde(default)]
    pub resources: Option<BTreeMap<String, f64>>,
    /// Serve the head's Prometheus metrics (the autoscaler's decisions and
    /// nodes among them) on this port, as `nimbus start
    /// --metrics-export-port` (0: any free port; default: none).
    pub metrics_export_port: Option<u16>,
}

/// How nodes are launched and stopped.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderConfig {
    /// Node processes on this machine (`nimbus start --block`).
    Local,
    /// A user's programs: `launch` starts one node, `terminate` stops one.
    Command {
        /// The program and its arguments that start a node (environment:
        /// `NIMBUS_NODE_NAME`, `NIMBUS_NODE_TYPE`, `NIMBUS_ADDRESS`,
        /// `NIMBUS_NODE_ARGS`; the token on its standard input).
        launch: Vec<String>,
        /// The program and its arguments that stop a node
        /// (`NIMBUS_NODE_NAME`, `NIMBUS_NODE_TYPE` set).
        terminate: Vec<String>,
        /// How long either may run, in seconds (default 60).
        #[serde(default)]
        timeout_s: Option<u64>,
    },
    /// One Slurm job per node (`sbatch`), cancelled to stop it (`scancel`).
    Slurm {
        /// `sbatch --partition`.
        #[serde(default)]
        partition: Option<String>,
        /// `sbatch --time`, Slurm's format (`1-00:00:00`).
        #[serde(default)]
        time_limit: Option<String>,
        /// More `sbatch` flags (`["--account=ml"]`).
        #[serde(default)]
        sbatch_args: Vec<String>,
        /// The cluster's token, in a file the compute nodes can read
        /// (mode 0600, on a shared filesystem): `nimbus start --token-file`.
        token_file: PathBuf,
        /// The nimbus binary on the compute nodes (default: `nimbus` on
        /// their PATH).
        #[serde(default)]
        nimbus: Option<String>,
        /// More `nimbus start` flags for every node (`["--object-store-memory",
        /// "8000000000"]`).
        #[serde(default)]
        start_args: Vec<String>,
        /// How long `sbatch` or `scancel` may run, in seconds (default 60).
        #[serde(default)]
        timeout_s: Option<u64>,
    },
    /// One Kubernetes pod per node (`kubectl create`), deleted to stop it.
    Kubernetes {
        /// The pods' namespace (default: kubectl's current one).
        #[serde(default)]
        namespace: Option<String>,
        /// The nimbus image the pods run (`make image`).
        image: String,
        /// The Secret whose `token` key holds the cluster's token
        /// (default `nimbus-token`, as `deploy/kubernetes/secret.yaml`).
        #[serde(default)]
        token_secret: Option<String>,
        /// The kubectl program (default: `kubectl` on PATH).
        #[serde(default)]
        kubectl: Option<String>,
        /// More `nimbus start` flags for every node.
        #[serde(default)]
        start_args: Vec<String>,
        /// How long `kubectl` may run, in seconds (default 60).
        #[serde(default)]
        timeout_s: Option<u64>,
    },
}

/// One kind of node the autoscaler launches.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeType {
    /// Its name; its nodes are `NAME-1`, `NAME-2`, ...
    pub name: String,
    /// What each of its nodes offers.
    pub resources: ResourceSet,
    /// Kept running whatever the demand.
    pub min: u32,
    /// Never more at once.
    pub max: u32,
}

impl NodeType {
    /// The `nimbus start` flags that make a node offer this type's resources.
    pub fn start_flags(&self) -> Vec<String> {
        resource_flags(&self.resources)
    }
}

/// The `--num-cpus`, `--num-gpus`, `--memory` and `--resources` flags of
/// `resources` (CPUs and GPUs 0 where not named: a node offers what its
/// type says, not what its machine has).
pub fn resource_flags(resources: &ResourceSet) -> Vec<String> {
    let mut flags = vec![
        "--num-cpus".to_string(),
        resources.amount(CPU).to_string(),
        "--num-gpus".to_string(),
        resources.amount(GPU).to_string(),
    ];
    if resources.amount(MEMORY) > 0.0 {
        flags.push("--memory".into());
        flags.push((resources.amount(MEMORY) as u64).to_string());
    }
    let custom: BTreeMap<&str, f64> = resources
        .iter()
        .filter(|(name, _)| ![CPU, GPU, MEMORY].contains(name))
        .collect();
    if !custom.is_empty() {
        flags.push("--resources".into());
        flags.push(serde_json::json!(custom).to_string());
    }
    flags
}

/// The file as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    max_workers: Option<u32>,
    idle_timeout_s: Option<u64>,
    upscaling_speed: Option<f64>,
    launch_timeout_s: Option<u64>,
    #[serde(default)]
    head: HeadConfig,
    provider: ProviderConfig,
    node_types: BTreeMap<String, FileNodeType>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNodeType {
    resources: BTreeMap<String, f64>,
    #[serde(default)]
    min_workers: u32,
    max_workers: u32,
}

impl ClusterConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, AutoscalerError> {
        let text = std::fs::read_to_string(path).map_err(|e| AutoscalerError::Config {
            path: path.to_path_buf(),
            problem: format!("cannot read it: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Checks `text`, the contents of `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, AutoscalerError> {
        let bad = |problem: String| AutoscalerError::Config {
            path: path.to_path_buf(),
            problem,
        };
        let file: File = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        if file.node_types.is_empty() {
            return Err(bad("no [node_types.NAME] table: give at least one".into()));
        }
        if file.node_types.len() > MAX_NODE_TYPES {
            return Err(bad(format!(
                "{} node types; at most {MAX_NODE_TYPES}",
                file.node_types.len()
            )));
        }
        let mut node_types = Vec::new();
        for (name, t) in file.node_types {
            check_type_name(&name)
                .map_err(|problem| bad(format!("node type {name:?}: {problem}")))?;
            let resources = resource_set(&t.resources)
                .map_err(|problem| bad(format!("node type {name}: {problem}")))?;
            if t.min_workers > t.max_workers {
                return Err(bad(format!(
                    "node type {name}: min_workers {} is more than its max_workers {}",
                    t.min_workers, t.max_workers
                )));
            }
            node_types.push(NodeType {
                name,
                resources,
                min: t.min_workers,
                max: t.max_workers,
            });
        }
        let max_workers = file
            .max_workers
            .unwrap_or_else(|| node_types.iter().map(|t| t.max).sum());
        let mins: u32 = node_types.iter().map(|t| t.min).sum();
        if mins > max_workers {
            return Err(bad(format!(
                "the node types' min_workers add up to {mins}, more than max_workers {max_workers}"
            )));
        }
        let upscaling_speed = file.upscaling_speed.unwrap_or(1.0);
        if !(upscaling_speed.is_finite() && upscaling_speed > 0.0) {
            return Err(bad(format!(
                "upscaling_speed {upscaling_speed} must be a number above 0"
            )));
        }
        let seconds = |value: Option<u64>, default: u64, name: &str| match value.unwrap_or(default)
        {
            0 => Err(bad(format!("{name} must be at least 1"))),
            s => Ok(Duration::from_secs(s)),
        };
        if let Some(resources) = &file.head.resources {
            resource_set(resources).map_err(|problem| bad(format!("[head] {problem}")))?;
        }
        match &file.provider {
            ProviderConfig::Command {
                launch, terminate, ..
            } if launch.is_empty() || terminate.is_empty() => {
                return Err(bad(
                    "[provider] kind = \"command\" needs launch = [PROGRAM, ARGS...] and terminate = [PROGRAM, ARGS...]".into(),
                ));
            }
            ProviderConfig::Slurm { token_file, .. } if !token_file.is_absolute() => {
                return Err(bad(format!(
                    "[provider] token_file {} must be an absolute path (the compute nodes read it)",
                    token_file.display()
                )));
            }
            ProviderConfig::Kubernetes { .. } => {
                // A pod is named after its node: a DNS label, with room
                // for the `-N` suffix.
                if let Some(name) = node_types.iter().map(|t: &NodeType| &t.name).find(|name| {
                    name.len() > 50
                        || !name.starts_with(|c: char| c.is_ascii_lowercase())
                        || !name
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                }) {
                    return Err(bad(format!(
                        "[node_types.{name}]: with kind = \"kubernetes\" a type's name is its pods' \
                         name prefix: lowercase letters, digits and '-', starting with a letter, \
                         at most 50 characters"
                    )));
                }
            }
            _ => {}
        }
        Ok(ClusterConfig {
            path: path.to_path_buf(),
            max_workers,
            idle_timeout: seconds(
                file.idle_timeout_s,
                DEFAULT_IDLE_TIMEOUT_S,
                "idle_timeout_s",
            )?,
            upscaling_speed,
            launch_timeout: seconds(
                file.launch_timeout_s,
                DEFAULT_LAUNCH_TIMEOUT_S,
                "launch_timeout_s",
            )?,
            head: file.head,
            provider: file.provider,
            node_types,
        })
    }

    /// The type named `name`.
    pub fn node_type(&self, name: &str) -> Option<&NodeType> {
        self.node_types.iter().find(|t| t.name == name)
    }
}

/// A node type's name: the start of its nodes' names (`NAME-N`), which
/// must not be a worker's.
fn check_type_name(name: &str) -> Result<(), String> {
    let plain = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain
        || name.is_empty()
        || name.len() > MAX_NODE_NAME - 12
        || name.starts_with(WORKER_NAME_PREFIX)
    {
        return Err(format!(
            "use 1 to {} letters, digits, '-' and '_', not starting with {WORKER_NAME_PREFIX:?}",
            MAX_NODE_NAME - 12
        ));
    }
    Ok(())
}

/// `resources` as a set, each amount finite, not negative, and GPUs whole.
pub fn resource_set(resources: &BTreeMap<String, f64>) -> Result<ResourceSet, String> {
    let mut set = ResourceSet::default();
    for (name, amount) in resources {
        if !amount.is_finite() || *amount < 0.0 {
            return Err(format!(
                "resource {name} = {amount}: amounts must be finite and not negative"
            ));
        }
        if name == GPU && amount.fract() != 0.0 {
            return Err(format!("GPU = {amount}: a node offers whole GPUs"));
        }
        set.set(name, *amount);
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterConfig, String> {
        ClusterConfig::parse(Path::new("c.toml"), text).map_err(|e| e.to_string())
    }

    const TYPES: &str = "[provider]\nkind = \"local\"\n[node_types.cpu-2]\nresources = { CPU = 2 }\nmax_workers = 2\n";

    #[test]
    fn a_small_config_takes_its_defaults() {
        let config = parse(TYPES).unwrap();
        assert_eq!(config.max_workers, 2, "the types' max_workers added up");
        assert_eq!(config.idle_timeout, Duration::from_secs(60));
        assert_eq!(config.node_types[0].resources, ResourceSet::of(CPU, 2.0));
        assert_eq!(
            config.node_types[0].start_flags(),
            ["--num-cpus", "2", "--num-gpus", "0"]
        );
    }

    #[test]
    fn every_mistake_is_named_with_the_file() {
        for (text, needle) in [
            ("max_workers = 1\n[provider]\nkind = \"local\"\n[node_types]\n", "no [node_types.NAME]"),
            (&format!("max_wrokers = 3\n{TYPES}"), "unknown field `max_wrokers`"),
            (&format!("idle_timeout_s = 0\n{TYPES}"), "idle_timeout_s must be at least 1"),
            (&format!("upscaling_speed = -1.0\n{TYPES}"), "upscaling_speed -1"),
            ("[provider]\nkind = \"cloud\"\n[node_types.a]\nresources = {}\nmax_workers = 1\n", "unknown variant `cloud`"),
            ("[provider]\nkind = \"command\"\nlaunch = []\nterminate = [\"x\"]\n[node_types.a]\nresources = {}\nmax_workers = 1\n", "needs launch"),
            ("[provider]\nkind = \"local\"\n[node_types.worker-x]\nresources = {}\nmax_workers = 1\n", "not starting with \"worker-\""),
            ("[provider]\nkind = \"local\"\n[node_types.\"a b\"]\nresources = {}\nmax_workers = 1\n", "node type \"a b\""),
            ("[provider]\nkind = \"local\"\n[node_types.g]\nresources = { GPU = 0.5 }\nmax_workers = 1\n", "whole GPUs"),
            ("[provider]\nkind = \"local\"\n[node_types.g]\nresources = { CPU = -1 }\nmax_workers = 1\n", "not negative"),
            ("[provider]\nkind = \"local\"\n[node_types.g]\nresources = {}\nmin_workers = 2\nmax_workers = 1\n", "min_workers 2 is more than"),
            ("[provider]\nkind = \"slurm\"\ntoken_file = \"token\"\n[node_types.a]\nresources = {}\nmax_workers = 1\n", "token_file token must be an absolute path"),
            ("[provider]\nkind = \"kubernetes\"\nimage = \"nimbus\"\n[node_types.Big_GPU]\nresources = {}\nmax_workers = 1\n", "[node_types.Big_GPU]: with kind = \"kubernetes\""),
            ("[provider]\nkind = \"kubernetes\"\n[node_types.a]\nresources = {}\nmax_workers = 1\n", "missing field `image`"),
            (&format!("max_workers = 1\n{}", TYPES.replace("max_workers = 2", "min_workers = 2\nmax_workers = 2")), "add up to 2"),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains("c.toml") && error.contains(needle), "{text}: {error}");
        }
    }
}
