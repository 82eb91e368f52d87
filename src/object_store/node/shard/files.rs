//! The shared-memory files of a node's objects on its tmpfs: made with
//! their blocks allocated (or claimed, for a copy), removed with their
//! pages given back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::host::files::{free_bytes, private_file};

/// Removes a shared-memory file. One that is `unread` (a complete
/// object's that no process was given to read, a spare, say) is also cut
/// to nothing through a handle opened before: the mapping its writer
/// keeps to write into it again (`process/kept_maps.rs`) would otherwise
/// hold its memory until dropped. Never cut a file still being written,
/// nor one a reader may map: it would fault them.
pub(super) fn remove_shared(path: &std::path::Path, unread: bool) -> std::io::Result<()> {
    let opened = unread.then(|| std::fs::OpenOptions::new().write(true).open(path));
    std::fs::remove_file(path)?;
    // Unlinked, the file is this node's alone: a failed cut costs only
    // the memory the mappings hold until dropped.
    if let Some(Ok(file)) = opened {
        let _ = file.set_len(0);
    }
    Ok(())
}

/// Removes a spare file ([`remove_shared`]), saying so if it cannot.
pub(super) fn remove_spare(path: &std::path::Path) {
    if let Err(e) = remove_shared(path, true) {
        tracing::warn!("cannot remove {}: {e}", path.display());
    }
}

/// Creates the shared-memory file at `path` and gives it its size with
/// `size`; a file that cannot be sized is removed.
pub(super) fn create_shared(
    path: &std::path::Path,
    size: impl FnOnce(&std::fs::File) -> std::io::Result<()>,
) -> std::io::Result<std::fs::File> {
    let file = private_file(path)?;
    if let Err(e) = size(&file) {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(file)
}

/// Creates the shared-memory file of an object of `total` bytes with its
/// blocks allocated, so that a full tmpfs refuses it now (ENOSPC) rather
/// than failing a write later, or killing a process that writes it in place
/// through a mapping (SIGBUS).
pub(super) fn reserve_shared(path: &std::path::Path, total: u64) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    create_shared(path, |file| {
        let length = libc::off_t::try_from(total).map_err(std::io::Error::other)?;
        // SAFETY: a plain system call on a file descriptor open for the call.
        match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, length) } {
            0 => Ok(()),
            error => Err(std::io::Error::from_raw_os_error(error)),
        }
    })
}

/// Room on the tmpfs that a copy being received may still take: its size,
/// given back when the copy is complete or dropped.
#[derive(Debug)]
pub(super) struct TmpfsClaim {
    claims: Arc<AtomicU64>,
    bytes: u64,
}

impl Drop for TmpfsClaim {
    fn drop(&mut self) {
        self.claims.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Creates the shared-memory file of a cached copy of `total` bytes,
/// which only this node writes (by `pwrite`, never through a mapping):
/// its blocks are allocated as the copy's bytes arrive, alongside the
/// transfer, instead of all of them before it (a first 256 MiB pull on
/// loopback went from 1.21–1.40 to 1.14–1.47 GB/s, median 1.26 to 1.45).
/// The tmpfs must have room for it beside what the copies under way
/// (`claims`) may still take, or it is refused now (ENOSPC), as
/// [`reserve_shared`] refuses a file it cannot allocate; only something
/// else filling the tmpfs meanwhile fails a copy's write (with ENOSPC,
/// which fails the pull with that error).
pub(super) fn create_copy_file(
    path: &std::path::Path,
    total: u64,
    claims: &Arc<AtomicU64>,
) -> std::io::Result<(std::fs::File, TmpfsClaim)> {
    let claimed_before = claims.fetch_add(total, Ordering::Relaxed);
    let claim = TmpfsClaim {
        claims: claims.clone(),
        bytes: total,
    };
    let free = path.parent().and_then(free_bytes);
    if free.is_some_and(|free| free < claimed_before.saturating_add(total)) {
        return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
    }
    let file = create_shared(path, |file| file.set_len(total))?;
    Ok((file, claim))
}
