//! Which attempt of a run owns its run directory, so that a worker of an
//! earlier attempt that still runs (its node partitioned and declared
//! dead, its process alive) cannot publish checkpoints over the current
//! attempt's.
//!
//! 1. Each attempt has a generation: a fit starts at one more than the generation
//!    the run directory holds (or 0), and each restart adds one, so generations
//!    grow across restarts and across fits of one run. Before an attempt
//!    launches, the supervisor claims the run directory for its generation
//!    ([`claim`]): `FENCE_FILE` then holds it, written through a temporary
//!    file and a rename. A claim older than the generation recorded is refused.
//! 2. Rank 0 checks the fence ([`check`]) right before it renames a
//!    written checkpoint into place; if a newer generation holds it, the
//!    write is dropped (its temporary directory removed) as
//!    [`Stale`](super::CheckpointError::Stale).
//!
//! The check and the rename are two steps: a claim that lands between them
//! lets one more checkpoint of the old attempt through. The new attempt
//! resumes from the checkpoint it chose before it claimed, and replaces a
//! checkpoint of the same index when it writes its own.

use std::path::Path;

use super::CheckpointError;
use nimbus::library::files::write_private;

/// The file in a run directory naming the generation that owns it.
pub const FENCE_FILE: &str = ".attempt";

/// The generation that owns `run_dir`, if one claimed it.
pub fn owner(run_dir: &Path) -> Result<Option<u64>, CheckpointError> {
    let path = run_dir.join(FENCE_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| CheckpointError::Corrupt {
                path,
                detail: format!("{FENCE_FILE} holds {text:?}, not a generation: {e}"),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Io {
            path,
            what: "cannot read",
            source,
        }),
    }
}

/// Claims `run_dir` for `generation` (step 1).
pub fn claim(run_dir: &Path, generation: u64) -> Result<(), CheckpointError> {
    check(run_dir, generation)?;
    let temporary = run_dir.join(format!("{FENCE_FILE}.tmp-{}", std::process::id()));
    let io = |what| {
        let path = temporary.clone();
        move |source| CheckpointError::Io { path, what, source }
    };
    write_private(&temporary, generation.to_string().as_bytes()).map_err(io("cannot write"))?;
    std::fs::rename(&temporary, run_dir.join(FENCE_FILE)).map_err(io("cannot publish"))
}

/// Whether `generation` may still write into `run_dir` (step 2): no newer
/// generation has claimed it.
pub fn check(run_dir: &Path, generation: u64) -> Result<(), CheckpointError> {
    match owner(run_dir)? {
        Some(newer) if newer > generation => Err(CheckpointError::Stale {
            dir: run_dir.to_path_buf(),
            generation,
            newer,
        }),
        _ => Ok(()),
    }
}
