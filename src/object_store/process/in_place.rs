//! Writing a large object into its shared-memory file on this host.
//!
//! 1. Open the file the node reserved (`CreateObject`: its blocks are
//!    allocated, and it is at least the object's size, so a write through a
//!    mapping cannot fault for want of space).
//! 2. Map it with every page mapped at once (`MAP_POPULATE`: one system
//!    call instead of a fault per 4 KiB page; a reused spare file's pages
//!    are already in memory).
//! 3. Copy the object in, split in `COPY_SLICE`-aligned parts over up to
//!    `MAX_COPY_THREADS` threads (as many as the host has cores): one
//!    thread's copy is bounded by its core, not by memory.
//! 4. Unmap, before the caller seals the object: no mapping of the writer
//!    outlives the write.
//!
//! A file shorter than the object (not one the node reserved) is written
//! with `pwrite` instead.

use std::os::unix::fs::FileExt;
use std::path::Path;

/// Most threads one copy uses.
const MAX_COPY_THREADS: usize = 4;

/// The smallest part a copy thread takes (smaller objects are copied by
/// one thread: starting another would cost more than it saves).
const COPY_SLICE: usize = 8 << 20;

/// Writes `bytes` at the start of the file at `path`; see the module docs.
pub(super) fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    if bytes.is_empty() || file.metadata()?.len() < bytes.len() as u64 {
        return file.write_all_at(bytes, 0);
    }
    // SAFETY: the node reserved this file for this object alone and does
    // not truncate it while the object is arriving, and its blocks are
    // allocated (step 1), so the mapping stays valid and backed while it
    // lives; nothing else writes it until it is sealed, after the unmap.
    let mut map = unsafe {
        memmap2::MmapOptions::new()
            .len(bytes.len())
            .populate()
            .map_mut(&file)?
    };
    copy(&mut map, bytes);
    Ok(())
}

/// Copies `from` into `to` (of the same length) on as many threads as
/// help.
fn copy(to: &mut [u8], from: &[u8]) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(MAX_COPY_THREADS).min(from.len() / COPY_SLICE).max(1);
    if threads == 1 {
        to.copy_from_slice(from);
        return;
    }
    let part = from.len().div_ceil(threads).next_multiple_of(COPY_SLICE);
    std::thread::scope(|scope| {
        for (to, from) in to.chunks_mut(part).zip(from.chunks(part)) {
            scope.spawn(move || to.copy_from_slice(from));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_lands_in_place_whatever_the_split() {
        let dir = tempfile::TempDir::new().unwrap();
        for len in [1, 4096, COPY_SLICE - 1, 3 * COPY_SLICE + 12_345] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
            // Reserved at least the object's size, as the node does; and a
            // file too short, written with pwrite.
            for reserved in [len as u64, len as u64 + 100, 0] {
                let path = dir.path().join(format!("{len}-{reserved}"));
                std::fs::File::create(&path)
                    .and_then(|f| f.set_len(reserved))
                    .unwrap();
                write(&path, &bytes).unwrap();
                let back = std::fs::read(&path).unwrap();
                assert_eq!(&back[..len], &bytes[..], "{len} bytes in {reserved}");
                assert!(back[len..].iter().all(|b| *b == 0));
            }
        }
    }
}
