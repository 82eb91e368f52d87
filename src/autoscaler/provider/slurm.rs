//! Nodes as Slurm jobs: each launch is one `sbatch` job of one node that
//! runs `nimbus start --block` joining the head (`--wrap`), the token read
//! from a private file on a filesystem the compute nodes share; stopping
//! a node is `scancel` of its job (its id, from `sbatch --parsable`, is in
//! the node's record). Both commands run within the config's `timeout_s`.

use std::path::PathBuf;
use std::time::Duration;

use super::command::{run_program, stop_with};
use super::{LaunchSpec, Launched, NodeProvider, Records};
use crate::autoscaler::AutoscalerError;
use crate::cluster::{CPU, GPU};

/// The Slurm settings of a cluster config.
#[derive(Clone, Debug)]
pub struct SlurmSettings {
    /// `sbatch --partition`.
    pub partition: Option<String>,
    /// `sbatch --time`.
    pub time_limit: Option<String>,
    /// More `sbatch` flags, as given.
    pub sbatch_args: Vec<String>,
    /// The token file the launched nodes read (mode 0600, shared).
    pub token_file: PathBuf,
    /// The nimbus binary on the compute nodes.
    pub nimbus: String,
    /// More `nimbus start` flags.
    pub start_args: Vec<String>,
    /// How long `sbatch` and `scancel` may take.
    pub timeout: Duration,
}

/// Nodes as Slurm jobs.
pub struct SlurmProvider {
    records: Records,
    settings: SlurmSettings,
}

impl SlurmProvider {
    /// A provider submitting with `settings`, keeping its records in `records`.
    pub fn new(records: Records, settings: SlurmSettings) -> Self {
        SlurmProvider { records, settings }
    }

    /// The `sbatch` command line that starts `node`.
    pub fn sbatch(&self, node: &LaunchSpec) -> Vec<String> {
        let s = &self.settings;
        let mut argv = vec![
            "sbatch".to_string(),
            "--parsable".into(),
            format!("--job-name=nimbus-{}", node.name),
            "--nodes=1".into(),
            "--ntasks=1".into(),
        ];
        let cpus = node.node_type.resources.amount(CPU).ceil() as u64;
        if cpus > 0 {
            argv.push(format!("--cpus-per-task={cpus}"));
        }
        let gpus = node.node_type.resources.amount(GPU) as u64;
        if gpus > 0 {
            argv.push(format!("--gres=gpu:{gpus}"));
        }
        if let Some(partition) = &s.partition {
            argv.push(format!("--partition={partition}"));
        }
        if let Some(time) = &s.time_limit {
            argv.push(format!("--time={time}"));
        }
        argv.extend(s.sbatch_args.iter().cloned());
        let mut start = vec![s.nimbus.clone()];
        start.extend(node.start_args());
        start.extend(s.start_args.iter().cloned());
        start.extend([
            "--token-file".to_string(),
            s.token_file.display().to_string(),
            "--block".into(),
        ]);
        let wrap: Vec<String> = start.iter().map(|a| shell_quote(a)).collect();
        argv.push(format!("--wrap=exec {}", wrap.join(" ")));
        argv
    }
}

/// `arg` quoted for `sh`.
fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c));
    match plain {
        true => arg.to_string(),
        false => format!("'{}'", arg.replace('\'', "'\\''")),
    }
}

impl NodeProvider for SlurmProvider {
    fn launch(&self, node: &LaunchSpec) -> Result<(), AutoscalerError> {
        let failed = |detail: String| AutoscalerError::Launch {
            node: node.name.clone(),
            detail,
        };
        let mut record = Launched::of(node);
        self.records.save(&record)?;
        let output = run_program(self.settings.timeout, &self.sbatch(node), &[], None).map_err(
            |detail| {
                self.records.remove(&node.name);
                failed(detail)
            },
        )?;
        // `--parsable`: JOBID or JOBID;CLUSTER.
        let job = output
            .lines()
            .next()
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        if job.is_empty() || !job.chars().all(|c| c.is_ascii_digit() || c == '_') {
            self.records.remove(&node.name);
            return Err(failed(format!("sbatch printed no job id: {output:?}")));
        }
        record.job = Some(job.to_string());
        self.records.save(&record)
    }

    fn terminate(&self, name: &str) -> Result<(), AutoscalerError> {
        if let Some(job) = self.records.get(name).and_then(|r| r.job) {
            stop_with(
                self.settings.timeout,
                &["scancel".to_string(), job],
                &[],
                name,
            )?;
        }
        self.records.remove(name);
        Ok(())
    }

    fn list(&self) -> Vec<Launched> {
        self.records.load()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autoscaler::config::NodeType;
    use crate::cluster::ResourceSet;

    #[test]
    fn sbatch_asks_for_one_node_of_the_type_and_starts_nimbus_on_it() {
        let provider = SlurmProvider::new(
            Records::new(std::path::Path::new("/nonexistent")),
            SlurmSettings {
                partition: Some("gpu".into()),
                time_limit: Some("1-00:00:00".into()),
                sbatch_args: vec!["--account=ml".into()],
                token_file: "/shared/nimbus token".into(),
                nimbus: "/shared/bin/nimbus".into(),
                start_args: vec!["--log-max-mib".into(), "16".into()],
                timeout: Duration::from_secs(60),
            },
        );
        let node = LaunchSpec {
            name: "gpu-8-3".into(),
            node_type: NodeType {
                name: "gpu-8".into(),
                resources: ResourceSet::of(CPU, 32.0)
                    .with(GPU, 8.0)
                    .with("accelerator_type:H200", 1.0),
                min: 0,
                max: 4,
            },
            head: "10.0.0.1:6379".into(),
            token: "nimbus1-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                .parse()
                .unwrap(),
            node_ip_address: None,
        };
        assert_eq!(
            provider.sbatch(&node),
            [
                "sbatch",
                "--parsable",
                "--job-name=nimbus-gpu-8-3",
                "--nodes=1",
                "--ntasks=1",
                "--cpus-per-task=32",
                "--gres=gpu:8",
                "--partition=gpu",
                "--time=1-00:00:00",
                "--account=ml",
                "--wrap=exec /shared/bin/nimbus start --address 10.0.0.1:6379 --node-name gpu-8-3 \
                 --num-cpus 32 --num-gpus 8 --resources '{\"accelerator_type:H200\":1.0}' \
                 --log-max-mib 16 --token-file '/shared/nimbus token' --block",
            ]
        );
    }
}
