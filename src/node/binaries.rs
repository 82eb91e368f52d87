//! The node's cache of program binaries, by SHA-256: a driver's executable
//! is shipped to a node once per content and reused by every worker of
//! every job that runs the same build.
//!
//! Binaries live under `state_dir/binaries/` (`$NIMBUS_HOME/binaries/`),
//! named by their hash (64 lowercase hex digits). An upload arrives in
//! chunks, in order (`UploadBinary`; the steps are on [`BinaryCache`]); on
//! the last one the hash is checked and only then is the binary published.
//! Another node that lacks it can read it from here chunk by chunk
//! (`ReadBinary`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::BinaryError;
use crate::host::files::{free_bytes, private_dir, private_file};

/// Mode of a cached program: its user may run it, nobody else may read it.
const PRIVATE_PROGRAM: u32 = 0o700;
/// The largest program a node takes: a larger upload is refused at its
/// first chunk.
pub(super) const MAX_BINARY_BYTES: u64 = 4 << 30;
/// An upload that gets no chunk for this long is abandoned: its partial
/// file is removed (checked whenever a chunk arrives).
pub(super) const UPLOAD_IDLE: Duration = Duration::from_secs(60);
/// Uploads in progress at once; more are refused until one ends.
pub(super) const MAX_UPLOADS: usize = 16;

/// Binaries cached under one directory, and uploads in progress.
///
/// Uploads, one per uploader and binary (two drivers shipping the same
/// build do not clobber each other):
/// 1. The first chunk (offset 0) of a binary of at most
///    [`MAX_BINARY_BYTES`], when fewer than [`MAX_UPLOADS`] are in
///    progress and the filesystem has room for it, begins one: a private
///    partial file `HASH.part-PID-N`. Offset 0 again starts over.
/// 2. Every chunk must continue the bytes received (one that does not ends
///    the upload and removes its file); it is handed back as a [`Write`],
///    blocking work the caller runs off its thread. A write that fails
///    (ENOSPC) removes the file, and the caller ends the upload
///    ([`BinaryCache::abort`]).
/// 3. The last chunk's [`Write`] then syncs, checks the SHA-256, sets the
///    mode and renames the binary into place. A binary someone published
///    meanwhile is kept, not replaced.
/// 4. Uploads idle for [`UPLOAD_IDLE`] are removed as the next chunk of any
///    upload arrives.
pub(super) struct BinaryCache {
    dir: PathBuf,
    uploads: HashMap<(String, String), Upload>,
    /// Numbers partial files, so no two uploads share one.
    parts: u64,
}

struct Upload {
    file: Arc<File>,
    path: PathBuf,
    received: u64,
    /// When its last chunk arrived.
    touched: Instant,
}

/// One chunk's file work (steps 2–3), blocking: run it off the actor's
/// thread.
#[must_use]
pub(super) struct Write {
    file: Arc<File>,
    path: PathBuf,
    offset: u64,
    chunk: Vec<u8>,
    /// After the last chunk: check and publish.
    last: Option<Publish>,
}

impl Write {
    /// Writes the chunk at its offset and, after the last one, checks and
    /// publishes the binary. A failed write removes the partial file.
    pub(super) fn run(self) -> Result<(), BinaryError> {
        let Write {
            file,
            path,
            offset,
            chunk,
            last,
        } = self;
        if let Err(source) = file.write_all_at(&chunk, offset) {
            let _ = fs::remove_file(&path);
            return Err(BinaryError::Io {
                action: "write",
                path,
                source,
            });
        }
        drop(file);
        last.map_or(Ok(()), Publish::run)
    }

    /// Whether this is the upload's last chunk.
    pub(super) fn is_last(&self) -> bool {
        self.last.is_some()
    }
}

/// A read of part of a cached binary, blocking: run it off the actor's
/// thread.
#[must_use]
pub(super) struct ReadChunk {
    path: PathBuf,
    offset: u64,
    len: u64,
}

impl ReadChunk {
    /// The whole length and the bytes read.
    pub(super) fn run(self) -> Result<(u64, Vec<u8>), BinaryError> {
        let ReadChunk { path, offset, len } = self;
        let failed = |source| BinaryError::Io {
            action: "read",
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(failed)?;
        let total = file.metadata().map_err(failed)?.len();
        let start = offset.min(total);
        let mut chunk = vec![0; len.min(total - start) as usize];
        file.read_exact_at(&mut chunk, start).map_err(failed)?;
        Ok((total, chunk))
    }
}

/// The last step of an upload (step 3).
struct Publish {
    file: Arc<File>,
    path: PathBuf,
    hash: String,
    target: PathBuf,
}

impl Publish {
    /// Syncs the bytes, checks their hash and publishes the binary.
    fn run(self) -> Result<(), BinaryError> {
        let Publish {
            file,
            path,
            hash,
            target,
        } = self;
        let failed = |action| {
            let path = path.clone();
            move |source| BinaryError::Io {
                action,
                path,
                source,
            }
        };
        let published = (|| {
            file.sync_all().map_err(failed("sync"))?;
            // Closed before it is published: a binary still open for
            // writing cannot be executed (ETXTBSY).
            drop(file);
            let actual = crate::host::sha256_file(&path).map_err(failed("hash"))?;
            if actual != hash {
                return Err(BinaryError::HashMismatch {
                    actual,
                    expected: hash,
                });
            }
            if target.is_file() {
                // Published meanwhile, by another upload or another node
                // sharing this directory: replacing a binary workers run
                // from gains nothing.
                return Ok(false);
            }
            fs::set_permissions(&path, fs::Permissions::from_mode(PRIVATE_PROGRAM))
                .map_err(failed("make executable"))?;
            fs::rename(&path, &target).map_err(failed("publish"))?;
            Ok(true)
        })();
        if !matches!(published, Ok(true)) {
            let _ = fs::remove_file(&path);
        }
        published.map(|_| ())
    }
}

/// The complete file `hash` in the cache directory `dir`, if it is there
/// (a job's working-directory archive is read this way).
pub(super) fn cached(dir: &Path, hash: &str) -> Option<PathBuf> {
    let path = dir.join(valid_hash(hash).ok()?);
    path.is_file().then_some(path)
}

impl BinaryCache {
    /// A cache in `dir` (created when first written).
    pub(super) fn new(dir: PathBuf) -> Self {
        BinaryCache {
            dir,
            uploads: HashMap::new(),
            parts: 0,
        }
    }

    /// The cached binary with this hash, if it is here.
    pub(super) fn get(&self, hash: &str) -> Option<PathBuf> {
        cached(&self.dir, hash)
    }

    /// Up to `len` bytes of the cached binary `hash` from `offset`, and its
    /// whole length (another node that lacks it is sent it this way):
    /// blocking work, run it off the actor's thread.
    pub(super) fn reader(
        &self,
        hash: &str,
        offset: u64,
        len: u64,
    ) -> Result<ReadChunk, BinaryError> {
        let path = self
            .get(hash)
            .ok_or_else(|| BinaryError::Missing(hash.to_string()))?;
        Ok(ReadChunk { path, offset, len })
    }

    /// Takes one chunk of `uploader`'s upload of `hash` (steps 1, 2, 4 of
    /// [`BinaryCache`]); `now` is the time it arrived.
    pub(super) fn receive(
        &mut self,
        uploader: &str,
        hash: &str,
        offset: u64,
        total: u64,
        chunk: Vec<u8>,
        now: Instant,
    ) -> Result<Write, BinaryError> {
        self.expire(now);
        let hash = valid_hash(hash)?.to_string();
        let key = (uploader.to_string(), hash.clone());
        if offset == 0 {
            self.abort(&key);
            self.begin(&key, total, now)?;
        }
        let upload = self
            .uploads
            .get_mut(&key)
            .ok_or_else(|| BinaryError::NoUpload(hash.clone()))?;
        if offset != upload.received || offset + chunk.len() as u64 > total {
            let expected = upload.received;
            self.abort(&key);
            return Err(BinaryError::OutOfOrder {
                offset,
                expected,
                total,
            });
        }
        upload.received += chunk.len() as u64;
        upload.touched = now;
        let mut write = Write {
            file: upload.file.clone(),
            path: upload.path.clone(),
            offset,
            chunk,
            last: None,
        };
        if upload.received < total {
            return Ok(write);
        }
        let Some(Upload { file, path, .. }) = self.uploads.remove(&key) else {
            return Err(BinaryError::NoUpload(hash));
        };
        let target = self.dir.join(&hash);
        write.last = Some(Publish {
            file,
            path,
            hash,
            target,
        });
        Ok(write)
    }

    /// Uploads in progress.
    #[cfg(test)]
    fn in_progress(&self) -> usize {
        self.uploads.len()
    }

    /// Begins an upload of `total` bytes (step 1).
    fn begin(
        &mut self,
        key: &(String, String),
        total: u64,
        now: Instant,
    ) -> Result<(), BinaryError> {
        if total > MAX_BINARY_BYTES {
            return Err(BinaryError::TooLarge {
                bytes: total,
                max: MAX_BINARY_BYTES,
            });
        }
        if self.uploads.len() >= MAX_UPLOADS {
            return Err(BinaryError::TooManyUploads { max: MAX_UPLOADS });
        }
        let io = |action, path: &PathBuf| {
            let path = path.clone();
            move |source| BinaryError::Io {
                action,
                path,
                source,
            }
        };
        private_dir(&self.dir).map_err(io("create", &self.dir))?;
        if let Some(free) = free_bytes(&self.dir).filter(|&free| free < total) {
            return Err(BinaryError::NoSpace {
                dir: self.dir.clone(),
                needed: total,
                free,
            });
        }
        self.parts += 1;
        let path = self.dir.join(format!(
            "{}.part-{}-{}",
            key.1,
            std::process::id(),
            self.parts
        ));
        let file = Arc::new(private_file(&path).map_err(io("write", &path))?);
        let upload = Upload {
            file,
            path,
            received: 0,
            touched: now,
        };
        self.uploads.insert(key.clone(), upload);
        Ok(())
    }

    /// Removes the uploads idle for longer than [`UPLOAD_IDLE`] (step 4).
    fn expire(&mut self, now: Instant) {
        let idle: Vec<_> = self
            .uploads
            .iter()
            .filter(|(_, u)| now.saturating_duration_since(u.touched) > UPLOAD_IDLE)
            .map(|(key, _)| key.clone())
            .collect();
        for key in idle {
            tracing::warn!(
                uploader = %key.0,
                "binary upload of {} abandoned: no chunk for {UPLOAD_IDLE:?}; its partial file is removed",
                key.1
            );
            self.abort(&key);
        }
    }

    /// Ends `uploader`'s upload of `hash`, removing its partial file (a
    /// chunk's write failed).
    pub(super) fn abort_upload(&mut self, uploader: &str, hash: &str) {
        self.abort(&(uploader.to_string(), hash.to_string()));
    }

    fn abort(&mut self, key: &(String, String)) {
        if let Some(upload) = self.uploads.remove(key) {
            let _ = fs::remove_file(upload.path);
        }
    }
}

/// A hash is 64 lowercase hex digits (it becomes a file name).
fn valid_hash(hash: &str) -> Result<&str, BinaryError> {
    let ok = hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(hash)
        .ok_or_else(|| BinaryError::BadHash(hash.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROGRAM: &[u8] = b"#!/bin/sh\necho hi\n";

    /// A cache in a fresh directory, and the hash of [`PROGRAM`].
    fn cache() -> (tempfile::TempDir, BinaryCache, String) {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("program");
        fs::write(&source, PROGRAM).unwrap();
        let hash = crate::host::sha256_file(&source).unwrap();
        let cache = BinaryCache::new(dir.path().join("cache"));
        (dir, cache, hash)
    }

    /// Sends bytes `range` of [`PROGRAM`] as `who`'s chunk.
    fn upload(
        cache: &mut BinaryCache,
        who: &str,
        hash: &str,
        range: std::ops::Range<usize>,
        now: Instant,
    ) -> Result<Write, BinaryError> {
        let total = PROGRAM.len() as u64;
        let chunk = PROGRAM[range.clone()].to_vec();
        cache.receive(who, hash, range.start as u64, total, chunk, now)
    }

    /// Writes and publishes what the last chunk handed back.
    fn publish(received: Write) -> Result<(), BinaryError> {
        assert!(received.is_last(), "more chunks wanted");
        received.run()
    }

    /// A chunk that is not the last, written.
    fn more(received: Result<Write, BinaryError>) {
        let write = received.unwrap();
        assert!(!write.is_last());
        write.run().unwrap();
    }

    /// Names in the cache directory.
    fn files(cache: &BinaryCache) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&cache.dir)
            .map(|dir| {
                dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn a_binary_arrives_in_chunks_and_is_checked() {
        let (dir, mut cache, hash) = cache();
        let now = Instant::now();
        assert!(cache.get(&hash).is_none());
        more(upload(&mut cache, "a", &hash, 0..10, now));
        publish(upload(&mut cache, "a", &hash, 10..PROGRAM.len(), now).unwrap()).unwrap();
        assert!(cache.get(&hash).is_some());

        let wrong = "0".repeat(64);
        let mismatch = publish(
            cache
                .receive("a", &wrong, 0, 3, b"abc".to_vec(), now)
                .unwrap(),
        )
        .unwrap_err();
        assert!(mismatch.to_string().contains("hashes to"), "{mismatch}");
        assert_eq!(
            files(&cache),
            std::slice::from_ref(&hash),
            "the mismatch left nothing"
        );
        // A hash that is a path: refused by name, before anything is
        // written (the cache's parent holds only the cache and the source).
        let traversal = cache
            .receive("a", "../etc", 0, 3, b"abc".to_vec(), now)
            .err()
            .unwrap()
            .to_string();
        assert!(traversal.contains("\"../etc\""), "{traversal}");
        let mut beside: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        beside.sort();
        assert_eq!(beside, ["cache", "program"]);
        assert!(cache
            .receive("a", &wrong, 5, 10, b"abc".to_vec(), now)
            .is_err());
    }

    /// Two drivers shipping the same build at once, chunks interleaved:
    /// both uploads complete. Before, the second's first chunk truncated
    /// the first's partial file and both failed.
    #[test]
    fn concurrent_uploads_of_one_binary_do_not_clobber_each_other() {
        let (_dir, mut cache, hash) = cache();
        let now = Instant::now();
        more(upload(&mut cache, "driver-1", &hash, 0..10, now));
        more(upload(&mut cache, "driver-2", &hash, 0..4, now));
        publish(upload(&mut cache, "driver-1", &hash, 10..PROGRAM.len(), now).unwrap()).unwrap();
        publish(upload(&mut cache, "driver-2", &hash, 4..PROGRAM.len(), now).unwrap()).unwrap();
        assert_eq!(fs::read(cache.get(&hash).unwrap()).unwrap(), PROGRAM);
        assert_eq!(files(&cache), [hash], "no partial file left");
        assert_eq!(cache.in_progress(), 0);
    }

    /// An uploader that vanishes mid-way: its partial file is removed once
    /// it has been idle for `UPLOAD_IDLE`, when any chunk arrives.
    #[test]
    fn an_abandoned_upload_expires() {
        let (_dir, mut cache, hash) = cache();
        let t0 = Instant::now();
        more(upload(&mut cache, "gone", &hash, 0..10, t0));
        assert_eq!(files(&cache).len(), 1);
        let other = "1".repeat(64);
        let almost = t0 + UPLOAD_IDLE;
        let _ = cache
            .receive("alive", &other, 0, 100, vec![0; 10], almost)
            .unwrap();
        assert_eq!(
            cache.in_progress(),
            2,
            "not idle for longer than UPLOAD_IDLE yet"
        );
        let later = almost + Duration::from_secs(1);
        let _ = cache
            .receive("alive", &other, 10, 100, vec![0; 10], later)
            .unwrap();
        assert_eq!(cache.in_progress(), 1);
        assert!(
            files(&cache).iter().all(|f| f.starts_with(&other)),
            "{:?}",
            files(&cache)
        );
        let gone = cache.receive(
            "gone",
            &hash,
            10,
            PROGRAM.len() as u64,
            PROGRAM[10..].to_vec(),
            later,
        );
        assert!(matches!(gone, Err(BinaryError::NoUpload(_))));
    }

    /// A chunk whose write fails (here: its partial file's descriptor
    /// cannot write) removes the partial file, and the caller's abort ends
    /// the upload.
    #[test]
    fn a_failed_write_removes_the_partial_file() {
        let (_dir, mut cache, hash) = cache();
        let now = Instant::now();
        let write = upload(&mut cache, "a", &hash, 0..10, now).unwrap();
        let read_only = Write {
            file: Arc::new(File::open(&write.path).unwrap()),
            ..write
        };
        let failed = read_only.run().unwrap_err();
        assert!(failed.to_string().contains("write"), "{failed}");
        assert_eq!(files(&cache), Vec::<String>::new(), "no partial file left");
        cache.abort_upload("a", &hash);
        assert_eq!(cache.in_progress(), 0);
    }

    #[test]
    fn oversized_uploads_and_too_many_uploads_are_refused() {
        let (_dir, mut cache, hash) = cache();
        let now = Instant::now();
        let huge = cache.receive("a", &hash, 0, MAX_BINARY_BYTES + 1, b"x".to_vec(), now);
        assert!(matches!(huge, Err(BinaryError::TooLarge { .. })));
        for uploader in 0..MAX_UPLOADS {
            more(upload(&mut cache, &uploader.to_string(), &hash, 0..1, now));
        }
        let refused = cache.receive("one more", &hash, 0, 19, b"#".to_vec(), now);
        assert!(matches!(refused, Err(BinaryError::TooManyUploads { .. })));
        assert_eq!(
            files(&cache).len(),
            MAX_UPLOADS,
            "one partial file each, no more"
        );
    }
}
