//! Checkpoints: what a training run saves and resumes from.
//!
//! On disk a checkpoint is a directory
//! `storage_path/<run name>/checkpoint_<index>` (the index is the report it
//! was saved with, zero-padded to 9 digits so names sort by index) holding:
//! - `checkpoint.safetensors` ([`TENSORS_FILE`]): every tensor
//!   (`model.<var>`, `optimizer.momentum.<param>`, the user's), loadable
//!   from Python with `safetensors.torch.load_file`;
//! - `manifest.json` ([`MANIFEST_FILE`]): [`Manifest`] (`format`
//!   [`FORMAT_VERSION`], `index`, `metrics`, the user's small `values` such
//!   as epoch, step, sampler position, RNG seed, `tensors_bytes`,
//!   `tensors_sha256`).
//!
//! Writes are atomic (rank 0's writer thread):
//! 1. write the tensor file into `.checkpoint_<index>.tmp-<generation>-<pid>/`
//!    and fsync it; hash it;
//! 2. write the manifest, fsync it and the temporary directory;
//! 3. unless a newer attempt owns the run directory (`fence.rs`), rename
//!    the directory into place (replacing one of the same index an earlier
//!    attempt left unreported) and fsync the run directory.
//!
//! A crash mid-write therefore leaves no `checkpoint_*` directory at all; a
//! checkpoint counts as saved only once renamed, and rank 0's context
//! removes the temporary directories of writes that never finished.
//! [`Checkpoint::load`] checks the size and checksum, so torn or corrupted
//! bytes are detected. Retention is the `CheckpointReporter`'s
//! (`reporter.rs`).

pub mod fence;
mod reporter;

use std::collections::BTreeMap;
use std::fs::{OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tch::Tensor;

pub use reporter::{Best, CheckpointReporter, Latest, LatestReply, Saved, SavedCheckpoint};

use super::Metrics;
use nimbus::library::files::{free_bytes, private_dir, private_file, PRIVATE_FILE};

/// The tensor file inside a checkpoint directory.
pub const TENSORS_FILE: &str = "checkpoint.safetensors";
/// The manifest inside a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Version of the manifest format.
pub const FORMAT_VERSION: u32 = 1;

/// Why a checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A filesystem operation failed.
    #[error("checkpoint {path}: {what}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The bytes on disk are not what the manifest says.
    #[error("checkpoint {path} is corrupt: {detail}")]
    Corrupt {
        /// The checkpoint directory.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
    /// libtorch could not save or load the tensors.
    #[error("checkpoint {path}: {detail}")]
    Tensors {
        /// The checkpoint directory.
        path: PathBuf,
        /// libtorch's error.
        detail: String,
    },
    /// A newer attempt owns the run directory: this writer is stale.
    #[error("checkpoint not written to {}: a later attempt (generation {newer}) owns it now, and this worker's attempt (generation {generation}) is over; it outlived its attempt", dir.display())]
    Stale {
        /// The run directory.
        dir: PathBuf,
        /// The writer's generation (`fence.rs`).
        generation: u64,
        /// The generation that claimed the directory.
        newer: u64,
    },
    /// The filesystem has no room for it: no restart can help.
    #[error(transparent)]
    NoSpace(#[from] NoSpace),
    /// A value is missing or of the wrong type.
    #[error("checkpoint value {key:?}: {detail}")]
    Value {
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

/// A checkpoint that did not fit on its filesystem (ENOSPC, EDQUOT, or
/// less free than it needs). It travels from rank 0 to the supervisor, so
/// it is serializable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("no space for checkpoint {index} in {}: it needs about {needed} bytes and {free} are free; free space there, or give the run a storage_path with room (RunConfig::new)", dir.display())]
pub struct NoSpace {
    /// The report index of the checkpoint.
    pub index: u64,
    /// The run directory.
    pub dir: PathBuf,
    /// Bytes the checkpoint needs (its tensors and manifest).
    pub needed: u64,
    /// Bytes free for this user on that filesystem when the write began.
    pub free: u64,
}

/// A checkpoint rank 0 saved that the driver cannot see: the run's
/// storage is not shared between the hosts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("rank 0 (on node {node}) saved checkpoint {}, but the driver does not find it there: storage_path must be a directory that every node and the driver share (a network filesystem), or a restart would start from scratch; give the run such a storage_path (RunConfig::new)", path.display())]
pub struct NotShared {
    /// The checkpoint directory rank 0 reported.
    pub path: PathBuf,
    /// The node rank 0 ran on.
    pub node: String,
}

/// What `manifest.json` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT_VERSION`].
    pub format: u32,
    /// The report index the checkpoint was saved with.
    pub index: u64,
    /// The attempt of the run that wrote it (0 in older manifests).
    #[serde(default)]
    pub attempt: u32,
    /// The metrics reported with it.
    pub metrics: Metrics,
    /// The user's values.
    pub values: BTreeMap<String, serde_json::Value>,
    /// Size of [`TENSORS_FILE`] in bytes.
    pub tensors_bytes: u64,
    /// SHA-256 of [`TENSORS_FILE`], lowercase hex.
    pub tensors_sha256: String,
}

/// Why a manifest file's bytes are not a manifest this build reads.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON of a manifest's shape.
    #[error("{MANIFEST_FILE} is not a manifest: {0}")]
    NotAManifest(#[from] serde_json::Error),
    /// Written by a build with another format.
    #[error("manifest format {0} (this build reads {FORMAT_VERSION})")]
    Format(u32),
}

impl Manifest {
    /// Reads a manifest from the bytes of its file, checking its format.
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let manifest: Manifest = serde_json::from_slice(bytes)?;
        if manifest.format != FORMAT_VERSION {
            return Err(ManifestError::Format(manifest.format));
        }
        Ok(manifest)
    }
}

/// Tensors and small values to save, or loaded from a saved checkpoint.
///
/// ```
/// use nimbus_train::tch::Tensor;
/// use nimbus_train::Checkpoint;
/// let checkpoint = Checkpoint::new()
///     .with_tensor("weight", &Tensor::from_slice(&[1.0f32, 2.0]))
///     .with_value("epoch", 3).unwrap();
/// assert_eq!(checkpoint.value::<u64>("epoch").unwrap(), 3);
/// ```
#[derive(Debug, Default)]
pub struct Checkpoint {
    tensors: Vec<(String, Tensor)>,
    values: BTreeMap<String, serde_json::Value>,
    index: u64,
    path: Option<PathBuf>,
}

impl Checkpoint {
    /// An empty checkpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a copy of `tensor` (on the CPU, detached), so training can go on
    /// changing the original while the copy is written.
    pub fn with_tensor(mut self, name: impl Into<String>, tensor: &Tensor) -> Self {
        let copy = tch::no_grad(|| tensor.detach().to_device(tch::Device::Cpu).copy());
        self.tensors.push((name.into(), copy));
        self
    }

    /// Adds a small serializable value (epoch, step, seed, ...).
    pub fn with_value(
        mut self,
        key: impl Into<String>,
        value: impl Serialize,
    ) -> Result<Self, CheckpointError> {
        let key = key.into();
        let value = serde_json::to_value(value).map_err(|e| CheckpointError::Value {
            key: key.clone(),
            detail: e.to_string(),
        })?;
        self.values.insert(key, value);
        Ok(self)
    }

    /// Adds every variable of `vs` as `model.<name>`.
    pub fn with_var_store(mut self, vs: &tch::nn::VarStore) -> Self {
        let mut variables: Vec<_> = vs.variables().into_iter().collect();
        variables.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, tensor) in variables {
            self = self.with_tensor(format!("model.{name}"), &tensor);
        }
        self
    }

    /// Copies the `model.<name>` tensors into `vs`'s variables; every
    /// variable must be present with its shape.
    pub fn restore_var_store(&self, vs: &tch::nn::VarStore) -> Result<(), CheckpointError> {
        let missing = |name: &str, detail: String| CheckpointError::Value {
            key: format!("model.{name}"),
            detail,
        };
        tch::no_grad(|| {
            for (name, mut variable) in vs.variables() {
                let saved = self
                    .tensor(&format!("model.{name}"))
                    .ok_or_else(|| missing(&name, "not in the checkpoint".into()))?;
                if saved.size() != variable.size() {
                    return Err(missing(
                        &name,
                        format!(
                            "shape {:?}, the model has {:?}",
                            saved.size(),
                            variable.size()
                        ),
                    ));
                }
                variable
                    .f_copy_(&saved.to_device(variable.device()))
                    .map_err(|e| missing(&name, e.to_string()))?;
            }
            Ok(())
        })
    }

    /// SHA-256 over the `model.*` tensors (name, then the values' bytes,
    /// little-endian, in name order): two runs that end with this digest
    /// ended with exactly the same parameters.
    pub fn model_sha256(&self) -> Result<String, CheckpointError> {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        let mut model: Vec<&(String, Tensor)> = self
            .tensors
            .iter()
            .filter(|(name, _)| name.starts_with("model."))
            .collect();
        model.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, tensor) in model {
            let tensor = tensor.to_kind(tch::Kind::Float).contiguous();
            let values = Vec::<f32>::try_from(tensor.flatten(0, -1)).map_err(|e| {
                CheckpointError::Value {
                    key: name.clone(),
                    detail: e.to_string(),
                }
            })?;
            digest.update(name.as_bytes());
            for value in values {
                digest.update(&value.to_le_bytes());
            }
        }
        Ok(digest
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
    }

    /// The tensor saved as `name`.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// Every tensor, in the order added (sorted by name once loaded).
    pub fn tensors(&self) -> &[(String, Tensor)] {
        &self.tensors
    }

    /// The value saved as `key`.
    pub fn value<T: DeserializeOwned>(&self, key: &str) -> Result<T, CheckpointError> {
        let value = self.values.get(key).ok_or_else(|| CheckpointError::Value {
            key: key.to_string(),
            detail: "not in the checkpoint".into(),
        })?;
        serde_json::from_value(value.clone()).map_err(|e| CheckpointError::Value {
            key: key.to_string(),
            detail: e.to_string(),
        })
    }

    /// The user's values.
    pub(crate) fn values(&self) -> &BTreeMap<String, serde_json::Value> {
        &self.values
    }

    /// A checkpoint of `values` and no tensor yet (a state from a peer).
    pub(crate) fn from_values(values: BTreeMap<String, serde_json::Value>) -> Self {
        Checkpoint {
            values,
            ..Self::default()
        }
    }

    /// This checkpoint, as if saved with report `index`.
    pub(crate) fn at_index(mut self, index: u64) -> Self {
        self.index = index;
        self
    }

    /// The report index it was saved with (0 for one not saved yet).
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The directory it was loaded from.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Loads and verifies the checkpoint in `dir`.
    pub fn load(dir: &Path) -> Result<Self, CheckpointError> {
        let manifest = verify(dir)?;
        let tensors = Tensor::read_safetensors(dir.join(TENSORS_FILE)).map_err(|e| {
            CheckpointError::Tensors {
                path: dir.to_path_buf(),
                detail: e.to_string(),
            }
        })?;
        let mut tensors = tensors;
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Checkpoint {
            tensors,
            values: manifest.values,
            index: manifest.index,
            path: Some(dir.to_path_buf()),
        })
    }

    /// Writes the checkpoint as `run_dir/checkpoint_<index>` for
    /// `attempt` (fenced by its `generation`, `fence.rs`), atomically.
    ///
    /// A write that fails leaves nothing behind: its temporary directory is
    /// removed. One that finds the filesystem without room for it (less
    /// free than it needs before it starts, or ENOSPC/EDQUOT on the way) is
    /// [`CheckpointError::NoSpace`]; one whose run directory a newer attempt
    /// claimed is [`CheckpointError::Stale`].
    pub fn save(
        &self,
        run_dir: &Path,
        index: u64,
        (attempt, generation): (u32, u64),
        metrics: &Metrics,
    ) -> Result<PathBuf, CheckpointError> {
        let needed = self.bytes_needed();
        let no_space = |free| NoSpace {
            index,
            dir: run_dir.to_path_buf(),
            needed,
            free,
        };
        let free = free_bytes(run_dir);
        if let Some(free) = free.filter(|&free| free < needed) {
            return Err(no_space(free).into());
        }
        let temporary = temporary_dir(run_dir, index, generation);
        let _ = std::fs::remove_dir_all(&temporary);
        let started = std::time::Instant::now();
        let written = self.write_into(&temporary, run_dir, index, (attempt, generation), metrics);
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&temporary);
        } else {
            metrics::histogram!("nimbus_checkpoint_write_seconds")
                .record(started.elapsed().as_secs_f64());
        }
        written.map_err(|e| match (e.os_error(), free) {
            (Some(libc::ENOSPC | libc::EDQUOT), Some(free)) => no_space(free).into(),
            _ => e,
        })
    }

    /// Bytes a save needs: the tensors' data and a margin for the
    /// safetensors header and the manifest.
    fn bytes_needed(&self) -> u64 {
        let data: u64 = self
            .tensors
            .iter()
            .map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as u64)
            .sum();
        data + 64 * 1024
    }

    /// Steps 1 to 3 of a write (module docs), through `temporary`.
    fn write_into(
        &self,
        temporary: &Path,
        run_dir: &Path,
        index: u64,
        (attempt, generation): (u32, u64),
        metrics: &Metrics,
    ) -> Result<PathBuf, CheckpointError> {
        let io = |path: &Path, what: &'static str| {
            let path = path.to_path_buf();
            move |source| CheckpointError::Io { path, what, source }
        };
        let final_dir = run_dir.join(directory_name(index));
        // The run directory is the user's (their umask); what goes in a
        // checkpoint is private: its directory is 0700 from the start.
        std::fs::create_dir_all(run_dir).map_err(io(run_dir, "cannot create"))?;
        private_dir(temporary).map_err(io(temporary, "cannot create"))?;
        let tensors_path = temporary.join(TENSORS_FILE);
        Tensor::write_safetensors(&self.tensors, &tensors_path).map_err(|e| {
            CheckpointError::Tensors {
                path: temporary.to_path_buf(),
                detail: e.to_string(),
            }
        })?;
        std::fs::set_permissions(&tensors_path, Permissions::from_mode(PRIVATE_FILE))
            .map_err(io(&tensors_path, "cannot make private"))?;
        sync_file(&tensors_path)?;
        let (tensors_bytes, tensors_sha256) = digest(&tensors_path)?;
        let manifest = Manifest {
            format: FORMAT_VERSION,
            index,
            attempt,
            metrics: metrics.clone(),
            values: self.values.clone(),
            tensors_bytes,
            tensors_sha256,
        };
        let manifest_path = temporary.join(MANIFEST_FILE);
        let json = serde_json::to_vec_pretty(&manifest).map_err(|e| CheckpointError::Value {
            key: "manifest".into(),
            detail: e.to_string(),
        })?;
        let mut file = private_file(&manifest_path).map_err(io(&manifest_path, "cannot create"))?;
        file.write_all(&json)
            .map_err(io(&manifest_path, "cannot write"))?;
        file.sync_all()
            .map_err(io(&manifest_path, "cannot fsync"))?;
        sync_dir(temporary)?;
        fence::check(run_dir, generation)?;
        if final_dir.exists() {
            // A checkpoint of the same index from an earlier attempt that
            // was never reported: this one replaces it.
            std::fs::remove_dir_all(&final_dir).map_err(io(&final_dir, "cannot replace"))?;
        }
        std::fs::rename(temporary, &final_dir).map_err(io(&final_dir, "cannot publish"))?;
        sync_dir(run_dir)?;
        Ok(final_dir)
    }
}

impl CheckpointError {
    /// The OS error behind it, if any. libtorch's tensor writer reports
    /// one only in its text (`os error N`).
    fn os_error(&self) -> Option<i32> {
        match self {
            CheckpointError::Io { source, .. } => source.raw_os_error(),
            CheckpointError::Tensors { detail, .. } => detail
                .split("os error ")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|code| code.parse().ok()),
            _ => None,
        }
    }
}

impl Checkpoint {
    /// What a write killed halfway leaves: the temporary directory with
    /// half of the tensor file and no manifest (fault injection).
    pub(crate) fn save_torn(&self, run_dir: &Path, index: u64, generation: u64) {
        let temporary = temporary_dir(run_dir, index, generation);
        let _ = std::fs::create_dir_all(&temporary);
        let file = temporary.join(TENSORS_FILE);
        if Tensor::write_safetensors(&self.tensors, &file).is_ok() {
            if let Ok(bytes) = std::fs::read(&file) {
                let _ = std::fs::write(&file, &bytes[..bytes.len() / 2]);
            }
        }
    }
}

/// Where a write of checkpoint `index` in `generation` is assembled (step 1):
/// never a name that another attempt's writer, on this host or another,
/// uses at the same time.
fn temporary_dir(run_dir: &Path, index: u64, generation: u64) -> PathBuf {
    run_dir.join(format!(
        ".{}.tmp-{generation}-{}",
        directory_name(index),
        std::process::id()
    ))
}

/// `checkpoint_<index>`, zero-padded so names sort by index.
pub fn directory_name(index: u64) -> String {
    format!("checkpoint_{index:09}")
}

/// Reads `dir`'s manifest and checks the tensor file against it.
pub fn verify(dir: &Path) -> Result<Manifest, CheckpointError> {
    let corrupt = |detail: String| CheckpointError::Corrupt {
        path: dir.to_path_buf(),
        detail,
    };
    let manifest_path = dir.join(MANIFEST_FILE);
    let bytes = std::fs::read(&manifest_path).map_err(|source| CheckpointError::Io {
        path: manifest_path.clone(),
        what: "cannot read",
        source,
    })?;
    let manifest = Manifest::parse(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let (size, sha) = digest(&dir.join(TENSORS_FILE))?;
    if size != manifest.tensors_bytes || sha != manifest.tensors_sha256 {
        return Err(corrupt(format!(
            "{TENSORS_FILE} is {size} bytes with SHA-256 {sha}, the manifest says {} bytes with {}",
            manifest.tensors_bytes, manifest.tensors_sha256
        )));
    }
    Ok(manifest)
}

/// The newest complete checkpoint that `attempt` wrote into `run_dir`
/// with an index above `newer_than`, if one verifies: a checkpoint rank 0
/// finished writing whose report the driver had not received when the
/// attempt failed (the report and a peer's death race). Newer ones of that
/// attempt that do not verify are skipped with a warning; a directory that
/// cannot be listed yields none.
pub fn unreported(
    run_dir: &Path,
    attempt: u32,
    newer_than: Option<u64>,
) -> Option<SavedCheckpoint> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(run_dir)
        .ok()?
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let index = path
                .file_name()?
                .to_str()?
                .strip_prefix("checkpoint_")?
                .parse()
                .ok()?;
            (newer_than.is_none_or(|n| index > n) && path.join(MANIFEST_FILE).is_file())
                .then_some((index, path))
        })
        .collect();
    found.sort_unstable_by_key(|(index, _)| std::cmp::Reverse(*index));
    found
        .into_iter()
        .find_map(|(index, path)| match verify(&path) {
            Ok(manifest) if manifest.attempt == attempt && manifest.index == index => {
                Some(SavedCheckpoint {
                    path,
                    index,
                    metrics: manifest.metrics,
                })
            }
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("skipping unreported checkpoint: {e}");
                None
            }
        })
}

fn digest(path: &Path) -> Result<(u64, String), CheckpointError> {
    let size = std::fs::metadata(path)
        .map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            what: "cannot stat",
            source,
        })?
        .len();
    let sha = nimbus::host::sha256_file(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        what: "cannot hash",
        source,
    })?;
    Ok((size, sha))
}

fn sync_file(path: &Path) -> Result<(), CheckpointError> {
    OpenOptions::new()
        .read(true)
        .open(path)
        .and_then(|f| f.sync_all())
        .map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            what: "cannot fsync",
            source,
        })
}

fn sync_dir(path: &Path) -> Result<(), CheckpointError> {
    nimbus::library::files::sync_dir(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        what: "cannot fsync directory",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_of_an_earlier_attempt_cannot_replace_the_current_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let metrics = Metrics::from([("loss".to_string(), 0.5)]);
        let with = |x: f32| Checkpoint::new().with_tensor("w", &Tensor::from_slice(&[x]));
        fence::claim(run, 3).unwrap();
        let current = with(1.0).save(run, 10, (1, 3), &metrics).unwrap();
        // The stale rank 0 (generation 2) still runs and writes the same
        // index: refused, nothing of it left, the current one intact.
        match with(2.0).save(run, 10, (0, 2), &metrics) {
            Err(CheckpointError::Stale {
                generation: 2,
                newer: 3,
                ..
            }) => {}
            other => panic!("expected Stale, got {other:?}"),
        }
        let loaded = Checkpoint::load(&current).unwrap();
        assert_eq!(
            Vec::<f32>::try_from(loaded.tensor("w").unwrap()).unwrap(),
            [1.0]
        );
        let mut names: Vec<_> = std::fs::read_dir(run)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, [fence::FENCE_FILE, "checkpoint_000000010"]);
        assert_eq!(verify(&current).unwrap().attempt, 1);
        // Claims only move forward.
        assert!(matches!(
            fence::claim(run, 2),
            Err(CheckpointError::Stale { .. })
        ));
        fence::claim(run, 4).unwrap();
        assert_eq!(fence::owner(run).unwrap(), Some(4));
    }

    #[test]
    fn the_newest_complete_unreported_checkpoint_of_the_failed_attempt_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path();
        let at = |index: u64| Metrics::from([("index".to_string(), index as f64)]);
        let save = |index: u64, attempt: u32| {
            Checkpoint::new()
                .with_tensor("w", &Tensor::from_slice(&[index as f32]))
                .save(run, index, (attempt, u64::from(attempt)), &at(index))
                .unwrap()
        };
        save(5, 1);
        let ten = save(10, 1);
        // Newer, but of the attempt before (never reported, then resumed
        // from an older one): not this attempt's state.
        save(15, 0);
        // Newer and of this attempt, but corrupt.
        let twelve = save(12, 1);
        std::fs::write(twelve.join(TENSORS_FILE), b"torn").unwrap();
        // Being written: no manifest yet.
        std::fs::create_dir(run.join(directory_name(13))).unwrap();

        let found = unreported(run, 1, Some(5)).expect("checkpoint 10");
        assert_eq!(
            found,
            SavedCheckpoint {
                path: ten,
                index: 10,
                metrics: at(10),
            }
        );
        assert_eq!(unreported(run, 1, None).unwrap().index, 10);
        assert_eq!(unreported(run, 1, Some(10)), None, "already reported");
        assert_eq!(unreported(run, 0, None).unwrap().index, 15);
        assert_eq!(unreported(run, 2, None), None);
        assert_eq!(unreported(&run.join("missing"), 1, None), None);
    }

    #[test]
    fn saves_atomically_loads_back_and_detects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = Checkpoint::new()
            .with_tensor("b", &Tensor::from_slice(&[3.0f32, 4.0]))
            .with_tensor("a", &Tensor::from_slice(&[1.0f64]))
            .with_value("epoch", 2u64)
            .unwrap();
        let metrics = Metrics::from([("loss".to_string(), 0.5)]);
        let path = checkpoint.save(dir.path(), 7, (0, 0), &metrics).unwrap();
        assert_eq!(path, dir.path().join("checkpoint_000000007"));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["checkpoint_000000007"], "no temporary left");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o700, "a checkpoint is private");
        assert_eq!(mode(&path.join(TENSORS_FILE)), 0o600);
        assert_eq!(mode(&path.join(MANIFEST_FILE)), 0o600);

        let loaded = Checkpoint::load(&path).unwrap();
        assert_eq!(loaded.index(), 7);
        assert_eq!(loaded.value::<u64>("epoch").unwrap(), 2);
        assert_eq!(
            Vec::<f32>::try_from(loaded.tensor("b").unwrap()).unwrap(),
            vec![3.0, 4.0]
        );
        assert!(loaded.value::<u64>("missing").is_err());

        // Flip one byte of the tensor file: detected.
        let file = path.join(TENSORS_FILE);
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&file, bytes).unwrap();
        let err = Checkpoint::load(&path).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    }
}
