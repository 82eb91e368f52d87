//! Worker logs on a node: `state_dir/logs/worker-ACTOR-INCARNATION.log`,
//! one per worker process (each restart of an actor is a new one), with
//! what the process wrote to stderr and printed to stdout (`workers.rs`).
//! Anyone of the cluster may read them (`ReadLog`), from any offset, at
//! most [`MAX_LOG_READ`] bytes a request; `nimbus logs` follows one by
//! reading on from where it stopped.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::cluster::ActorId;

/// The most bytes of a log one request returns.
pub(super) const MAX_LOG_READ: u64 = 1 << 20;

/// The log of `actor`'s newest worker process in `dir`, if it ran here.
pub(super) fn newest(dir: &Path, actor: ActorId) -> Option<PathBuf> {
    let prefix = format!("{}-", actor.worker_name());
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let stamp: u64 = name
                .strip_prefix(&prefix)?
                .strip_suffix(".log")?
                .parse()
                .ok()?;
            Some((stamp, entry.path()))
        })
        .max_by_key(|(stamp, _)| *stamp)
        .map(|(_, path)| path)
}

/// The log's length, and up to `max` (at most [`MAX_LOG_READ`]) bytes of
/// it from `offset`. Blocking.
pub(super) fn read(path: &Path, offset: u64, max: u64) -> std::io::Result<(u64, Vec<u8>)> {
    let file = File::open(path)?;
    let total = file.metadata()?.len();
    let start = offset.min(total);
    let mut bytes = vec![0; max.min(MAX_LOG_READ).min(total - start) as usize];
    file.read_exact_at(&mut bytes, start)?;
    Ok((total, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_incarnations_log_is_read_from_an_offset() {
        let dir = tempfile::tempdir().unwrap();
        let actor = ActorId(0xab);
        let log = |stamp: u64| {
            dir.path()
                .join(format!("{}-{stamp}.log", actor.worker_name()))
        };
        std::fs::write(log(5), "first life\n").unwrap();
        std::fs::write(log(17), "second life\nmore\n").unwrap();
        std::fs::write(dir.path().join("worker-00000000000000ac-99.log"), "other").unwrap();
        let newest = newest(dir.path(), actor).unwrap();
        assert_eq!(newest, log(17));
        assert_eq!(read(&newest, 12, 100).unwrap(), (17, b"more\n".to_vec()));
        assert_eq!(read(&newest, 40, 100).unwrap(), (17, Vec::new()));
        assert_eq!(read(&newest, 0, 6).unwrap().1, b"second");
        assert!(super::newest(dir.path(), ActorId(1)).is_none());
    }
}
