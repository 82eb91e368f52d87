//! The shared-memory files this process keeps mapped to write its large
//! puts into (step 1 of `process/mod.rs`).
//!
//! Writing into a file of the node's tmpfs costs the kernel a page lookup
//! per 4 KiB page, whether through `pwrite` or by faulting in a new
//! mapping; through a mapping whose page tables are already filled in it
//! is a memory copy (on the 2-core development machine, 100 MiB into a
//! file whose pages exist: 19–38 ms by `pwrite`, 16 ms through a new
//! mapping filled in at once, 6 ms through a kept one). The node reuses
//! the files of freed objects for new ones (its spares,
//! `node/shard/budget.rs`), so a process that keeps the mappings of the
//! files it wrote finds them again.
//!
//! 1. The node grants a file of the object's size (`CreateObject`). The
//!    process opens it and looks its device and inode up among the kept
//!    mappings: one of the file's length is taken out and reused, one of
//!    another length dropped; otherwise the file is mapped with its page
//!    tables filled in (`MAP_POPULATE`).
//! 2. The object is copied in and the mapping put back, the least
//!    recently used dropped beyond [`MAX_KEPT`]; then the process seals
//!    the object.
//! 3. A kept mapping is written through only while the node has granted
//!    its file to this process, and never read: the node cuts a file to a
//!    new size and grants it again (to any process) only once its object
//!    is freed, and step 1's length check keeps every write inside the
//!    file.
//! 4. A mapping holds its file's memory once the node has removed the
//!    file (an object freed after a process mapped it to read it), until
//!    it is dropped: the node cuts a spare it removes to nothing,
//!    but any other removed file stays in memory as long as it is mapped.
//!    So before each large put, and every [`SWEEP_EVERY`] while any
//!    mapping is kept (a task that ends when none is left), the process
//!    drops the mappings of removed files (no link left) and those unused
//!    for [`KEEP_FOR`]. A process with no Tokio runtime keeps none; when
//!    the runtime that runs the sweeping task ends, the kept mappings go
//!    with it.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// The most mappings a process keeps (as many as the spare files a node
/// keeps, `MAX_SPARE_FILES`).
pub(super) const MAX_KEPT: usize = 4;

/// A mapping unused this long is dropped (step 4).
pub(super) const KEEP_FOR: Duration = Duration::from_secs(10);

/// How often the kept mappings are checked (step 4): at most this long a
/// removed file's memory stays in use after its last other mapping goes.
pub(super) const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A file's identity on its host: its device and inode (a spare is
/// renamed when reused, so its path says nothing).
type FileKey = (u64, u64);

struct Kept {
    key: FileKey,
    /// Open, to tell when the node has removed the file (no link left).
    file: File,
    map: memmap2::MmapMut,
    used: Instant,
}

#[derive(Default)]
struct KeptMaps {
    maps: Vec<Kept>,
    /// Whether a sweeping task runs (step 4).
    sweeping: bool,
}

static KEPT: Mutex<KeptMaps> = Mutex::new(KeptMaps {
    maps: Vec::new(),
    sweeping: false,
});

fn kept() -> MutexGuard<'static, KeptMaps> {
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes `len` bytes, written by `fill` into the mapping itself, at the
/// start of the shared-memory file at `path`, which the node has granted
/// this process at exactly that length (steps 1–2).
pub(super) fn write_with(
    path: &Path,
    len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let metadata = file.metadata()?;
    if metadata.len() != len as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} holds {} bytes, not the {} of the object granted",
                path.display(),
                metadata.len(),
                len
            ),
        ));
    }
    let key = (metadata.dev(), metadata.ino());
    let mut target = match take(key, len) {
        Some(target) => target,
        None => Kept {
            key,
            // SAFETY: the node has granted this file to this process at
            // this length, and neither cuts nor grants it again before
            // the object is sealed and freed; the mapping is only
            // written through while the file is granted here, and never
            // read (step 3).
            map: unsafe { memmap2::MmapOptions::new().populate().map_mut(&file)? },
            file,
            used: Instant::now(),
        },
    };
    fill(&mut target.map);
    target.used = Instant::now();
    keep(target);
    Ok(())
}

/// The kept mapping of file `key`, taken out, if it is `len` bytes long.
fn take(key: FileKey, len: usize) -> Option<Kept> {
    let mut kept = kept();
    let found = kept.maps.iter().position(|map| map.key == key)?;
    let map = kept.maps.swap_remove(found);
    (map.map.len() == len).then_some(map)
}

/// Keeps `map` (step 2), starting the sweep if none runs.
fn keep(map: Kept) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let start_sweep = {
        let mut kept = kept();
        if kept.maps.len() >= MAX_KEPT {
            let oldest = (0..kept.maps.len()).min_by_key(|&i| kept.maps[i].used);
            if let Some(oldest) = oldest {
                kept.maps.swap_remove(oldest);
            }
        }
        kept.maps.push(map);
        !std::mem::replace(&mut kept.sweeping, true)
    };
    // Outside the lock: a runtime shutting down drops the task at once,
    // and with it the guard, which takes the lock.
    if start_sweep {
        runtime.spawn(sweep(Sweeping));
    }
}

/// Held by the sweeping task. Dropped with it when its runtime ends (or
/// never runs it), it drops every kept mapping: none is kept unswept.
struct Sweeping;

impl Drop for Sweeping {
    fn drop(&mut self) {
        let mut kept = kept();
        kept.sweeping = false;
        kept.maps.clear();
    }
}

/// Drops the mappings of removed files and of files unused for
/// [`KEEP_FOR`] (step 4); before a large put, so that the memory of the
/// files removed since is free for it.
pub(super) fn sweep_now() {
    drop_stale(&mut kept(), Instant::now());
}

fn drop_stale(kept: &mut KeptMaps, now: Instant) {
    kept.maps.retain(|map| {
        now.saturating_duration_since(map.used) < KEEP_FOR
            && map.file.metadata().is_ok_and(|file| file.nlink() > 0)
    });
}

/// [`drop_stale`] every [`SWEEP_EVERY`], until no mapping is left (step
/// 4).
async fn sweep(sweeping: Sweeping) {
    loop {
        tokio::time::sleep(SWEEP_EVERY).await;
        let mut kept = kept();
        drop_stale(&mut kept, Instant::now());
        if kept.maps.is_empty() {
            kept.sweeping = false;
            drop(kept);
            std::mem::forget(sweeping);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        write_with(path, bytes.len(), |map| map.copy_from_slice(bytes))
    }

    fn temp_file(dir: &Path, name: &str, len: u64) -> std::path::PathBuf {
        let path = dir.join(name);
        File::create(&path).unwrap().set_len(len).unwrap();
        path
    }

    fn kept_keys() -> Vec<FileKey> {
        kept().maps.iter().map(|map| map.key).collect()
    }

    fn key_of(path: &Path) -> FileKey {
        let metadata = std::fs::metadata(path).unwrap();
        (metadata.dev(), metadata.ino())
    }

    /// One test, as the kept mappings are one per process.
    #[tokio::test]
    async fn writes_through_kept_mappings_and_drops_them_when_files_go() {
        let dir = tempfile::tempdir().unwrap();
        let a = temp_file(dir.path(), "a", 4096);
        write(&a, &[7; 4096]).unwrap();
        assert_eq!(std::fs::read(&a).unwrap(), vec![7; 4096]);
        assert_eq!(kept_keys(), vec![key_of(&a)]);

        assert!(kept().sweeping, "a kept mapping is swept");

        // The file renamed and granted again: the same mapping is reused.
        let mapped_at = kept().maps[0].map.as_ptr();
        let renamed = dir.path().join("renamed");
        std::fs::rename(&a, &renamed).unwrap();
        write(&renamed, &[9; 4096]).unwrap();
        assert_eq!(std::fs::read(&renamed).unwrap(), vec![9; 4096]);
        assert_eq!(kept_keys(), vec![key_of(&renamed)]);
        assert_eq!(kept().maps[0].map.as_ptr(), mapped_at, "mapped anew");

        // Cut to another length: mapped anew, never written past its end.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&renamed)
            .unwrap()
            .set_len(1024)
            .unwrap();
        write(&renamed, &[3; 1024]).unwrap();
        assert_eq!(std::fs::read(&renamed).unwrap(), vec![3; 1024]);
        assert_eq!(kept().maps[0].map.len(), 1024);

        // A write of another length than the file's is refused.
        let error = write(&renamed, &[1; 2048]).unwrap_err();
        assert!(error.to_string().contains("holds 1024 bytes"), "{error}");

        // At most MAX_KEPT, the least recently used dropped first.
        let others: Vec<_> = (0..MAX_KEPT)
            .map(|i| temp_file(dir.path(), &format!("other-{i}"), 4096))
            .collect();
        for other in &others {
            write(other, &[1; 4096]).unwrap();
        }
        assert_eq!(kept().maps.len(), MAX_KEPT);
        assert!(!kept_keys().contains(&key_of(&renamed)));

        // A removed file's mapping goes at the next sweep, by the task or
        // before a put.
        let gone = key_of(&others[0]);
        std::fs::remove_file(&others[0]).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while kept_keys().contains(&gone) {
            assert!(Instant::now() < deadline, "the sweeping task kept {gone:?}");
            tokio::task::yield_now().await;
        }
        assert_eq!(kept().maps.len(), MAX_KEPT - 1);
        let also_gone = key_of(&others[1]);
        std::fs::remove_file(&others[1]).unwrap();
        sweep_now();
        assert!(!kept_keys().contains(&also_gone));
        assert_eq!(kept().maps.len(), MAX_KEPT - 2);

        // Unused ones go after KEEP_FOR.
        drop_stale(&mut kept(), Instant::now() + KEEP_FOR);
        assert!(kept().maps.is_empty());

        // With none left, the sweeping task ends.
        let deadline = Instant::now() + Duration::from_secs(10);
        while kept().sweeping {
            assert!(Instant::now() < deadline, "the sweep did not end");
            tokio::task::yield_now().await;
        }
    }
}
