//! Worker logs on a node, two per worker process (each restart of an actor
//! is a new one): `state_dir/logs/worker-ACTOR-INCARNATION.out`, what it
//! printed to stdout, and `.err`, what it wrote to stderr (`workers.rs`).
//! Anyone of the cluster may read them (`ReadLog`), from any offset, at
//! most [`MAX_LOG_READ`] bytes a request; `nimbus logs` follows one by
//! reading on from where it stopped. A worker's stderr also reaches its
//! job's driver: the node reads each live worker's `.err` on every
//! [`STDERR_EVERY`] (complete lines only, [`MAX_LOG_READ`] at most) and
//! keeps the new lines with what it printed (`output.rs`).
//!
//! Rotation by size, for worker and job-driver logs alike (their writers
//! hold the file open for appending, so it is rotated in place):
//! 1. Every [`ROTATE_EVERY`] (5 s) the node checks the logs of the
//!    processes it runs; one past its limit (`--log-max-mib`, default
//!    [`DEFAULT_LOG_MAX`], 64 MiB) is copied to `NAME.1` (replacing
//!    the one before) and truncated to nothing; its writers append from
//!    the start again. So a log and its one predecessor hold at most about
//!    twice the limit; what is written between the copy and the truncation
//!    is lost.
//! 2. A reader whose offset lies past the log's end after a rotation
//!    starts over from 0 (`nimbus logs --follow` says so).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::cluster::{ActorId, LogChunk};
use crate::wire::{RemoteError, RemoteErrorKind};

/// The most bytes of a log one request returns.
pub(super) const MAX_LOG_READ: u64 = 1 << 20;
/// How often a node checks its logs' sizes.
pub(super) const ROTATE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// A log's size limit unless the node is told another (`--log-max-mib`).
pub const DEFAULT_LOG_MAX: u64 = 64 << 20;

/// Step 1: if `path` is larger than `max` bytes, copies it to `NAME.1`
/// and truncates it; whether it did. Blocking.
pub(super) fn rotate_if_larger(path: &Path, max: u64) -> std::io::Result<bool> {
    let len = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= max {
        return Ok(false);
    }
    let mut previous = path.as_os_str().to_owned();
    previous.push(".1");
    std::fs::copy(path, &previous)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_len(0)?;
    Ok(true)
}

/// How often a node reads what its workers wrote to stderr, for their
/// drivers.
pub(super) const STDERR_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Which of a worker's logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stream {
    /// What it printed to stdout (`.out`).
    Out,
    /// What it wrote to stderr (`.err`).
    Err,
}

impl Stream {
    fn suffix(self) -> &'static str {
        match self {
            Stream::Out => ".out",
            Stream::Err => ".err",
        }
    }

    /// The `stream` log of `actor`'s worker of `incarnation` in `dir`.
    pub(super) fn path(self, dir: &Path, actor: ActorId, incarnation: u64) -> PathBuf {
        dir.join(format!(
            "{}-{incarnation}{}",
            actor.worker_name(),
            self.suffix()
        ))
    }
}

/// New complete lines of the log at `path` from `offset` (at most
/// [`MAX_LOG_READ`] bytes; a longer line is cut there), and the offset
/// after them; from the start if the log shrank (rotated). Blocking.
pub(super) fn new_lines(path: &Path, offset: u64) -> std::io::Result<(u64, Vec<String>)> {
    let (total, bytes) = read(path, offset, MAX_LOG_READ)?;
    let (offset, bytes) = match total < offset {
        true => (0, read(path, 0, MAX_LOG_READ)?.1),
        false => (offset, bytes),
    };
    let complete = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(last) => last + 1,
        None if bytes.len() as u64 == MAX_LOG_READ => bytes.len(),
        None => 0,
    };
    let lines = String::from_utf8_lossy(&bytes[..complete])
        .lines()
        .map(str::to_string)
        .collect();
    Ok((offset + complete as u64, lines))
}

/// The `stream` log of `actor`'s newest worker process in `dir`, if it
/// ran here.
pub(super) fn newest(dir: &Path, actor: ActorId, stream: Stream) -> Option<PathBuf> {
    let prefix = format!("{}-", actor.worker_name());
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let stamp: u64 = name
                .strip_prefix(&prefix)?
                .strip_suffix(stream.suffix())?
                .parse()
                .ok()?;
            Some((stamp, entry.path()))
        })
        .max_by_key(|(stamp, _)| *stamp)
        .map(|(_, path)| path)
}

/// Up to `max` bytes from `offset` of the log `find` names (`Err`: why
/// there is none), read on the blocking pool.
pub(super) async fn read_chunk(
    find: impl FnOnce() -> Result<PathBuf, String> + Send + 'static,
    offset: u64,
    max: u64,
) -> Result<LogChunk, RemoteError> {
    let read = tokio::task::spawn_blocking(move || {
        let path = find()?;
        let (total, bytes) = read(&path, offset, max).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("{} does not exist", path.display()),
            _ => format!("cannot read {}: {e}", path.display()),
        })?;
        Ok::<_, String>(LogChunk {
            file: path.display().to_string(),
            total,
            bytes,
        })
    })
    .await
    .map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))?;
    read.map_err(|why| RemoteError::new(RemoteErrorKind::BadRequest, why))
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
    fn a_log_past_its_limit_is_kept_once_and_its_writer_appends_from_the_start() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("worker-00000000000000ab-1.err");
        let mut writer = crate::host::files::private_log(&path).unwrap();
        writer.write_all(&[b'a'; 100]).unwrap();
        assert!(!rotate_if_larger(&path, 100).unwrap(), "at the limit: kept");
        writer.write_all(b"b").unwrap();
        assert!(rotate_if_larger(&path, 100).unwrap());
        let previous = dir.path().join("worker-00000000000000ab-1.err.1");
        assert_eq!(std::fs::read(&previous).unwrap().len(), 101);
        writer.write_all(b"after\n").unwrap();
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"after\n",
            "no hole, no old bytes"
        );
        assert!(!rotate_if_larger(&dir.path().join("gone.log"), 1).unwrap());
    }

    #[test]
    fn the_newest_incarnations_log_is_read_from_an_offset() {
        let dir = tempfile::tempdir().unwrap();
        let actor = ActorId(0xab);
        let log = |stamp: u64, stream: Stream| stream.path(dir.path(), actor, stamp);
        std::fs::write(log(5, Stream::Out), "first life\n").unwrap();
        std::fs::write(log(17, Stream::Out), "second life\nmore\n").unwrap();
        std::fs::write(log(17, Stream::Err), "on stderr\n").unwrap();
        std::fs::write(dir.path().join("worker-00000000000000ac-99.out"), "other").unwrap();
        let newest = newest(dir.path(), actor, Stream::Out).unwrap();
        assert_eq!(newest, log(17, Stream::Out));
        assert_eq!(read(&newest, 12, 100).unwrap(), (17, b"more\n".to_vec()));
        assert_eq!(read(&newest, 40, 100).unwrap(), (17, Vec::new()));
        assert_eq!(read(&newest, 0, 6).unwrap().1, b"second");
        assert_eq!(
            super::newest(dir.path(), actor, Stream::Err),
            Some(log(17, Stream::Err))
        );
        assert!(super::newest(dir.path(), ActorId(1), Stream::Out).is_none());
    }

    #[test]
    fn only_complete_lines_are_taken_and_a_rotated_log_is_read_from_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.err");
        std::fs::write(&path, "one\ntwo\npart").unwrap();
        let (offset, lines) = new_lines(&path, 0).unwrap();
        assert_eq!(
            (offset, lines),
            (8, vec!["one".to_string(), "two".to_string()])
        );
        assert_eq!(
            new_lines(&path, offset).unwrap(),
            (8, Vec::new()),
            "the partial line waits"
        );
        std::fs::write(&path, "new\n").unwrap();
        assert_eq!(
            new_lines(&path, offset).unwrap(),
            (4, vec!["new".to_string()])
        );
    }
}
