//! The node's cache of program binaries, by SHA-256: a driver's executable
//! is shipped to a node once per content and reused by every worker of
//! every job that runs the same build.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

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
    pub(super) fn read(&self, hash: &str, offset: u64, len: u64) -> Result<(u64, Vec<u8>), String> {
        use std::io::{Seek, SeekFrom};
        let path = self
            .get(hash)
            .ok_or_else(|| format!("this node has no binary {hash}"))?;
        let mut file =
            File::open(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let total = file.metadata().map_err(|e| e.to_string())?.len();
        file.seek(SeekFrom::Start(offset.min(total)))
            .map_err(|e| e.to_string())?;
        let mut chunk = Vec::new();
        file.take(len)
            .read_to_end(&mut chunk)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
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
    ) -> Result<(), String> {
        let hash = valid_hash(hash)?.to_string();
        if offset == 0 {
            fs::create_dir_all(&self.dir)
                .map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
            let path = self.dir.join(format!("{hash}.part-{}", std::process::id()));
            let file =
                File::create(&path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            self.uploads.insert(
                hash.clone(),
                Upload {
                    file,
                    path,
                    received: 0,
                },
            );
        }
        let upload = self
            .uploads
            .get_mut(&hash)
            .ok_or_else(|| format!("no upload of {hash} in progress; start at offset 0"))?;
        if offset != upload.received || offset + chunk.len() as u64 > total {
            let expected = upload.received;
            self.abort(&hash);
            return Err(format!(
                "chunk at {offset} does not follow the {expected} bytes received of {total}"
            ));
        }
        upload.file.write_all(chunk).map_err(|e| e.to_string())?;
        upload.received += chunk.len() as u64;
        if upload.received < total {
            return Ok(());
        }
        let Some(upload) = self.uploads.remove(&hash) else {
            return Err(format!("the upload of {hash} vanished"));
        };
        let Upload { file, path, .. } = upload;
        file.sync_all().map_err(|e| e.to_string())?;
        // Closed before it is published: a binary still open for writing
        // cannot be executed (ETXTBSY).
        drop(file);
        let actual = crate::cluster::sha256_file(&path)?;
        if actual != hash {
            let _ = fs::remove_file(&path);
            return Err(format!("uploaded binary hashes to {actual}, not {hash}"));
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
        let target = self.dir.join(&hash);
        if target.is_file() {
            // Another node sharing this directory published the same bytes
            // already; replacing a binary workers run from gains nothing.
            let _ = fs::remove_file(&path);
            return Ok(());
        }
        fs::rename(&path, target).map_err(|e| e.to_string())
    }

    fn abort(&mut self, hash: &str) {
        if let Some(upload) = self.uploads.remove(hash) {
            let _ = fs::remove_file(upload.path);
        }
    }
}

/// A hash is 64 lowercase hex digits (it becomes a file name).
fn valid_hash(hash: &str) -> Result<&str, String> {
    let ok = hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(hash)
        .ok_or_else(|| format!("{hash:?} is not a SHA-256 in hex"))
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
            .contains("hashes to"));
        // A hash that is a path: refused by name, before anything is
        // written (the cache's parent holds only the cache and the source).
        let traversal = cache.receive("../etc", 0, 3, b"abc").unwrap_err();
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
