//! The node's cache of program binaries, by SHA-256: a driver's executable
//! is shipped to a node once per content and reused by every worker of
//! every job that runs the same build.
//!
//! Binaries live under `state_dir/binaries/` (`$NIMBUS_HOME/binaries/`),
//! named by their hash (64 lowercase hex digits). An upload arrives in
//! chunks, in order (`UploadBinary`); on the last one the hash is checked
//! and only then is the binary published. Another node that lacks it can
//! read it from here chunk by chunk (`ReadBinary`).

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::error::BinaryError;
use crate::cluster::files::{private_dir, private_file};

/// Mode of a cached program: its user may run it, nobody else may read it.
const PRIVATE_PROGRAM: u32 = 0o700;

/// Binaries cached under one directory, and uploads in progress.
pub(super) struct BinaryCache {
    dir: PathBuf,
    uploads: HashMap<String, Upload>,
}

struct Upload {
    file: File,
    path: PathBuf,
    received: u64,
}

impl BinaryCache {
    /// A cache in `dir` (created when first written).
    pub(super) fn new(dir: PathBuf) -> Self {
        BinaryCache {
            dir,
            uploads: HashMap::new(),
        }
    }

    /// The cached binary with this hash, if it is here.
    pub(super) fn get(&self, hash: &str) -> Option<PathBuf> {
        let path = self.dir.join(valid_hash(hash).ok()?);
        path.is_file().then_some(path)
    }

    /// Up to `len` bytes of the cached binary `hash` from `offset`, and its
    /// whole length (another node that lacks it is sent it this way).
    pub(super) fn read(
        &self,
        hash: &str,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<u8>), BinaryError> {
        use std::io::{Seek, SeekFrom};
        let path = self
            .get(hash)
            .ok_or_else(|| BinaryError::Missing(hash.to_string()))?;
        let failed = |source| BinaryError::Io {
            action: "read",
            path: path.clone(),
            source,
        };
        let mut file = File::open(&path).map_err(failed)?;
        let total = file.metadata().map_err(failed)?.len();
        file.seek(SeekFrom::Start(offset.min(total)))
            .map_err(failed)?;
        let mut chunk = Vec::new();
        file.take(len).read_to_end(&mut chunk).map_err(failed)?;
        Ok((total, chunk))
    }

    /// Appends one chunk; on the last one, checks the hash and publishes the
    /// binary. Chunks must come in order.
    pub(super) fn receive(
        &mut self,
        hash: &str,
        offset: u64,
        total: u64,
        chunk: &[u8],
    ) -> Result<(), BinaryError> {
        let hash = valid_hash(hash)?.to_string();
        if offset == 0 {
            self.begin(&hash)?;
        }
        let upload = self
            .uploads
            .get_mut(&hash)
            .ok_or_else(|| BinaryError::NoUpload(hash.clone()))?;
        if offset != upload.received || offset + chunk.len() as u64 > total {
            let expected = upload.received;
            self.abort(&hash);
            return Err(BinaryError::OutOfOrder {
                offset,
                expected,
                total,
            });
        }
        let path = upload.path.clone();
        let failed = |action| {
            let path = path.clone();
            move |source| BinaryError::Io {
                action,
                path,
                source,
            }
        };
        upload.file.write_all(chunk).map_err(failed("write"))?;
        upload.received += chunk.len() as u64;
        if upload.received < total {
            return Ok(());
        }
        let Some(Upload { file, .. }) = self.uploads.remove(&hash) else {
            return Err(BinaryError::NoUpload(hash));
        };
        file.sync_all().map_err(failed("sync"))?;
        // Closed before it is published: a binary still open for writing
        // cannot be executed (ETXTBSY).
        drop(file);
        let actual = crate::cluster::sha256_file(&path).map_err(failed("hash"))?;
        if actual != hash {
            let _ = fs::remove_file(&path);
            return Err(BinaryError::HashMismatch {
                actual,
                expected: hash,
            });
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(PRIVATE_PROGRAM))
            .map_err(failed("make executable"))?;
        let target = self.dir.join(&hash);
        if target.is_file() {
            // Another node sharing this directory published the same bytes
            // already; replacing a binary workers run from gains nothing.
            let _ = fs::remove_file(&path);
            return Ok(());
        }
        fs::rename(&path, target).map_err(failed("publish"))
    }

    /// Starts the upload of `hash` (again, if one was in progress).
    fn begin(&mut self, hash: &str) -> Result<(), BinaryError> {
        let io = |action, path: &PathBuf| {
            let path = path.clone();
            move |source| BinaryError::Io {
                action,
                path,
                source,
            }
        };
        private_dir(&self.dir).map_err(io("create", &self.dir))?;
        let path = self.dir.join(format!("{hash}.part-{}", std::process::id()));
        let file = private_file(&path).map_err(io("write", &path))?;
        let upload = Upload {
            file,
            path,
            received: 0,
        };
        self.uploads.insert(hash.to_string(), upload);
        Ok(())
    }

    fn abort(&mut self, hash: &str) {
        if let Some(upload) = self.uploads.remove(hash) {
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

    #[test]
    fn a_binary_arrives_in_chunks_and_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("program");
        fs::write(&source, b"#!/bin/sh\necho hi\n").unwrap();
        let hash = crate::cluster::sha256_file(&source).unwrap();
        let mut cache = BinaryCache::new(dir.path().join("cache"));
        assert!(cache.get(&hash).is_none());
        cache.receive(&hash, 0, 18, b"#!/bin/sh\n").unwrap();
        cache.receive(&hash, 10, 18, b"echo hi\n").unwrap();
        assert!(cache.get(&hash).is_some());

        let wrong = "0".repeat(64);
        assert!(cache
            .receive(&wrong, 0, 3, b"abc")
            .unwrap_err()
            .to_string()
            .contains("hashes to"));
        // A hash that is a path: refused by name, before anything is
        // written (the cache's parent holds only the cache and the source).
        let traversal = cache
            .receive("../etc", 0, 3, b"abc")
            .unwrap_err()
            .to_string();
        assert!(traversal.contains("\"../etc\""), "{traversal}");
        let mut beside: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        beside.sort();
        assert_eq!(beside, ["cache", "program"]);
        assert!(cache.receive(&wrong, 5, 10, b"abc").is_err());
    }
}
