//! Fault hooks of the training layer, triggered by training step, so a
//! rerun with the same rules fails the same step: kill or panic a worker,
//! slow it down (a straggler), hang it inside the collective, fail or tear
//! rank 0's checkpoint write, or corrupt a written checkpoint.
//!
//! The step of a fault is the report index the worker is working towards
//! (the first step is 1; it continues across restarts from a checkpoint).
//! Each rule fires once per run: a restarted group does not die again of a
//! rule that fired, and a rule whose step an attempt did not reach fires in
//! the next. They come from
//! `nimbus_train::RunConfig::faults` and, for a program run under
//! `nimbus chaos run`, from [`TRAINING_FAULTS_ENV`] (JSON).

use serde::{Deserialize, Serialize};

use crate::cluster::faults::FiredFault;
use crate::transport::FaultPlanError;

/// Environment variable a driver reads training fault rules from.
pub const TRAINING_FAULTS_ENV: &str = "NIMBUS_TRAINING_FAULTS";

/// One training fault.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingFault {
    /// The rank it hits (checkpoint faults: rank 0, the writer).
    #[serde(default)]
    pub rank: usize,
    /// The step that triggers it.
    pub at_step: u64,
    /// What happens.
    pub action: TrainingFaultAction,
}

/// What a training fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[serde(deny_unknown_fields)]
pub enum TrainingFaultAction {
    /// SIGKILL the worker process.
    Kill,
    /// SIGKILL the node the worker runs on (its workers die with it): a
    /// node lost at a training step. Not on the head, which the cluster
    /// cannot lose (the rule is then logged and skipped).
    KillNode,
    /// SIGKILL the head, and start it again `down_ms` later from its store
    /// (`nimbus chaos run`, which owns the cluster, does both when the
    /// worker reports the fault; elsewhere only the report happens): the
    /// head lost and back while training goes on.
    KillHead {
        /// How long the head stays down.
        down_ms: u64,
    },
    /// Panic in the training loop.
    Panic,
    /// Sleep this long before each collective, for `steps` steps.
    Straggle {
        /// Delay per step, in milliseconds.
        delay_ms: u64,
        /// How many steps.
        steps: u64,
    },
    /// Stop inside the collective and never arrive (until aborted).
    HangInCollective,
    /// The checkpoint write of this step fails once with this error: a
    /// passing write failure, which restarts the group. (A real full disk
    /// is found before writing, or from the write's ENOSPC, and stops the
    /// run: `TrainError::StorageFull`.)
    FailCheckpointWrite {
        /// The error.
        error: StorageError,
    },
    /// The worker is SIGKILLed halfway through writing this step's
    /// checkpoint (a torn write).
    TornCheckpointWrite,
    /// After this step's checkpoint is written, one of its bytes is
    /// flipped (bit rot).
    CorruptCheckpoint,
}

/// A storage error to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageError {
    /// ENOSPC.
    DiskFull,
    /// EACCES.
    PermissionDenied,
}

impl StorageError {
    /// The OS error it stands for.
    pub fn io_error(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(match self {
            StorageError::DiskFull => libc::ENOSPC,
            StorageError::PermissionDenied => libc::EACCES,
        })
    }
}

impl TrainingFault {
    /// The fault's kind, in the words of the chaos timeline.
    pub fn kind(&self) -> String {
        match self.action {
            TrainingFaultAction::Kill => "kill".into(),
            TrainingFaultAction::KillNode => "kill_node".into(),
            TrainingFaultAction::KillHead { down_ms } => format!("kill_head({down_ms}ms)"),
            TrainingFaultAction::Panic => "panic".into(),
            TrainingFaultAction::Straggle { delay_ms, steps } => {
                format!("straggle({delay_ms}ms x {steps} steps)")
            }
            TrainingFaultAction::HangInCollective => "hang_in_collective".into(),
            TrainingFaultAction::FailCheckpointWrite { error } => {
                format!("fail_checkpoint_write({error:?})")
            }
            TrainingFaultAction::TornCheckpointWrite => "torn_checkpoint_write".into(),
            TrainingFaultAction::CorruptCheckpoint => "corrupt_checkpoint".into(),
        }
    }

    /// The rank it hits, as a chaos timeline target: `rank-R`.
    pub fn target(&self) -> String {
        format!("rank-{}", self.rank)
    }

    /// The reason a worker reports when the fault fires:
    /// `chaos: KIND at step N of rank-R`.
    pub fn reason(&self) -> String {
        self.fired().to_string()
    }

    /// The fault as fired: its kind, `step N`, `rank-R`.
    pub fn fired(&self) -> FiredFault {
        FiredFault::new(self.kind(), format!("step {}", self.at_step), self.target())
    }

    /// Rules from [`TRAINING_FAULTS_ENV`], if set.
    pub fn from_env() -> Result<Vec<TrainingFault>, FaultPlanError> {
        let rules = FaultPlanError::read(TRAINING_FAULTS_ENV, "a list of training faults")?;
        Ok(rules.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_read_as_toml_and_json_and_name_themselves() {
        let rule: TrainingFault = toml::from_str(
            "rank = 1\nat_step = 7\naction = { straggle = { delay_ms = 50, steps = 3 } }",
        )
        .unwrap();
        assert_eq!(
            rule.reason(),
            "chaos: straggle(50ms x 3 steps) at step 7 of rank-1"
        );
        let json = serde_json::to_string(&vec![rule.clone()]).unwrap();
        assert_eq!(
            serde_json::from_str::<Vec<TrainingFault>>(&json).unwrap(),
            vec![rule]
        );
        let write: TrainingFault = toml::from_str(
            "at_step = 5\naction = { fail_checkpoint_write = { error = \"disk_full\" } }",
        )
        .unwrap();
        assert_eq!(write.rank, 0);
        assert_eq!(write.io_error_kind(), Some(libc::ENOSPC));
    }

    impl TrainingFault {
        fn io_error_kind(&self) -> Option<i32> {
            match self.action {
                TrainingFaultAction::FailCheckpointWrite { error } => {
                    error.io_error().raw_os_error()
                }
                _ => None,
            }
        }
    }
}
