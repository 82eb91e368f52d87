//! A trial's checkpoints: its state at a result, so a retried, resumed or
//! exploiting (PBT) trial goes on from there rather than from the start.
//!
//! `trial_<n>/checkpoint_<iteration>/state.msgpack` holds the state the
//! trainable passed to `TrialContext::report_with_checkpoint`, MessagePack
//! (`rmp-serde`) encoded. Writes are atomic, by the trial's runner:
//! 1. write `state.msgpack` into `.checkpoint_<iteration>.tmp-<pid>/` and
//!    fsync it and that directory;
//! 2. rename the directory into place (replacing one of the same
//!    iteration an earlier attempt left) and fsync the trial directory;
//! 3. only then is the result reported, naming the checkpoint: a
//!    checkpoint the tuner knows of is complete.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::library::files::{private_dir, private_file, sync_dir};

/// The state file inside a checkpoint directory.
pub const STATE_FILE: &str = "state.msgpack";

/// A complete checkpoint of a trial.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrialCheckpoint {
    /// The result (iteration) it was saved with.
    pub iteration: u64,
    /// Its directory.
    pub path: PathBuf,
}

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A filesystem operation failed.
    #[error("trial checkpoint {path}: {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The state could not be encoded or decoded as the trainable's type.
    #[error("trial checkpoint {path}: {detail}")]
    Codec {
        /// The checkpoint.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

fn io<'a>(
    path: &'a Path,
    what: &'static str,
) -> impl FnOnce(std::io::Error) -> CheckpointError + 'a {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        what,
        source,
    }
}

/// `checkpoint_<iteration>`, zero-padded so names sort by iteration.
pub fn directory_name(iteration: u64) -> String {
    format!("checkpoint_{iteration:06}")
}

/// Writes `state` as trial `trial_dir`'s checkpoint at `iteration`
/// (steps 1 and 2).
pub fn write<S: Serialize + ?Sized>(
    trial_dir: &Path,
    iteration: u64,
    state: &S,
) -> Result<TrialCheckpoint, CheckpointError> {
    let bytes = rmp_serde::to_vec_named(state).map_err(|e| CheckpointError::Codec {
        path: trial_dir.join(directory_name(iteration)),
        detail: format!("cannot encode the state: {e}"),
    })?;
    write_bytes(trial_dir, iteration, &bytes)
}

/// Writes encoded state `bytes` as a checkpoint (steps 1 and 2).
fn write_bytes(
    trial_dir: &Path,
    iteration: u64,
    bytes: &[u8],
) -> Result<TrialCheckpoint, CheckpointError> {
    let path = trial_dir.join(directory_name(iteration));
    let temporary = trial_dir.join(format!(
        ".{}.tmp-{}",
        directory_name(iteration),
        std::process::id()
    ));
    private_dir(&temporary).map_err(io(&temporary, "cannot create"))?;
    let file = temporary.join(STATE_FILE);
    let mut out = private_file(&file).map_err(io(&file, "cannot create"))?;
    out.write_all(bytes).map_err(io(&file, "cannot write"))?;
    out.sync_all().map_err(io(&file, "cannot fsync"))?;
    sync_dir(&temporary).map_err(io(&temporary, "cannot fsync"))?;
    if path.exists() {
        std::fs::remove_dir_all(&path).map_err(io(&path, "cannot replace"))?;
    }
    std::fs::rename(&temporary, &path).map_err(io(&path, "cannot rename into place"))?;
    sync_dir(trial_dir).map_err(io(trial_dir, "cannot fsync"))?;
    Ok(TrialCheckpoint { iteration, path })
}

/// Reads a checkpoint's state as an `S`.
pub fn read<S: for<'de> Deserialize<'de>>(checkpoint: &Path) -> Result<S, CheckpointError> {
    let file = checkpoint.join(STATE_FILE);
    let bytes = std::fs::read(&file).map_err(io(&file, "cannot read"))?;
    rmp_serde::from_slice(&bytes).map_err(|e| CheckpointError::Codec {
        path: checkpoint.to_path_buf(),
        detail: format!("the state does not decode as the trainable's type: {e}"),
    })
}

/// Copies `source` (another trial's checkpoint) into `trial_dir` as its
/// own checkpoint of the same iteration (PBT's exploit), atomically.
pub fn copy(
    source: &TrialCheckpoint,
    trial_dir: &Path,
) -> Result<TrialCheckpoint, CheckpointError> {
    let file = source.path.join(STATE_FILE);
    let bytes = std::fs::read(&file).map_err(io(&file, "cannot read"))?;
    write_bytes(trial_dir, source.iteration, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_and_replaces_one_of_its_iteration() {
        let dir = tempfile::tempdir().unwrap();
        let saved = write(dir.path(), 3, &(1u32, "a")).unwrap();
        assert_eq!(saved.path, dir.path().join("checkpoint_000003"));
        assert_eq!(read::<(u32, String)>(&saved.path).unwrap(), (1, "a".into()));
        write(dir.path(), 3, &(2u32, "b")).unwrap();
        assert_eq!(read::<(u32, String)>(&saved.path).unwrap(), (2, "b".into()));
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["checkpoint_000003"], "no temporary left");
        let other = tempfile::tempdir().unwrap();
        let copied = copy(&saved, other.path()).unwrap();
        assert_eq!(copied.path, other.path().join("checkpoint_000003"));
        assert_eq!(
            read::<(u32, String)>(&copied.path).unwrap(),
            (2, "b".into())
        );
        let wrong = read::<Vec<f64>>(&saved.path).unwrap_err();
        assert!(wrong.to_string().contains("does not decode"), "{wrong}");
    }
}
