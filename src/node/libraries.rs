//! Whether a program can load its shared libraries on this machine, asked
//! before a node starts a worker from it: a program built elsewhere (a
//! program that trains looks for libtorch at the path it was built
//! against) must be refused with the libraries named, not die in the
//! dynamic loader with a message that only its log keeps.
//!
//! The check, once per cached binary that passes (`checked`):
//! 1. Read the program's ELF interpreter (`PT_INTERP`, e.g.
//!    `/lib64/ld-linux-x86-64.so.2`). A program without one (static, or
//!    not ELF) loads no libraries: nothing to check.
//! 2. Run the interpreter on the program with `LD_TRACE_LOADED_OBJECTS=1`
//!    (what `ldd` does: the loader lists every library, found or not, and
//!    exits without running the program; its `--list` stops at the first
//!    missing one), with the node's environment (its `LD_LIBRARY_PATH` is
//!    the workers'), for at most [`LIST_TIMEOUT`].
//! 3. Every listed library that is `not found` is missing. A listing that
//!    fails otherwise refuses nothing: the worker's own start then says
//!    what went wrong.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest the interpreter may take to list a program's libraries.
pub(super) const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// `PT_INTERP`: the program header naming the dynamic loader.
const PT_INTERP: u32 = 3;
/// The longest interpreter path read.
const MAX_INTERPRETER: u64 = 4096;

/// The binaries whose libraries were all found, by path (a cached
/// binary's path names its content), so each is checked once.
#[derive(Clone, Default)]
pub(super) struct Checked(Arc<Mutex<HashSet<PathBuf>>>);

impl Checked {
    /// The libraries `binary` needs that this machine does not have
    /// (empty when it has them all, or cannot tell); steps 1–3.
    pub(super) async fn missing(&self, binary: &Path) -> Vec<String> {
        if self.lock().contains(binary) {
            return Vec::new();
        }
        let missing = match interpreter(binary) {
            Some(interpreter) => list_missing(&interpreter, binary).await,
            None => Vec::new(),
        };
        if missing.is_empty() {
            self.lock().insert(binary.to_path_buf());
        }
        missing
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<PathBuf>> {
        // The set stays consistent whatever panicked while holding it.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Step 1: the ELF interpreter of `binary` (64-bit little-endian ELF, as
/// on x86-64 and aarch64), if it has one.
fn interpreter(binary: &Path) -> Option<PathBuf> {
    let file = File::open(binary).ok()?;
    let read = |offset: u64, len: usize| -> Option<Vec<u8>> {
        let mut bytes = vec![0; len];
        file.read_exact_at(&mut bytes, offset).ok()?;
        Some(bytes)
    };
    let header = read(0, 64)?;
    // Magic, 64-bit class, little-endian.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |bytes: &[u8], at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |bytes: &[u8], at: usize| {
        u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default())
    };
    let u64_at = |bytes: &[u8], at: usize| {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
    };
    let (table, entry, count) = (
        u64_at(&header, 0x20),
        u64::from(u16_at(&header, 0x36)),
        u64::from(u16_at(&header, 0x38)),
    );
    if entry < 56 {
        return None;
    }
    for index in 0..count {
        let program_header = read(table.checked_add(index.checked_mul(entry)?)?, 56)?;
        if u32_at(&program_header, 0) != PT_INTERP {
            continue;
        }
        let (offset, size) = (u64_at(&program_header, 8), u64_at(&program_header, 32));
        let path = read(offset, usize::try_from(size.min(MAX_INTERPRETER)).ok()?)?;
        let path = path.split(|&b| b == 0).next()?;
        return Some(PathBuf::from(std::str::from_utf8(path).ok()?));
    }
    None
}

/// Steps 2 and 3: the libraries `interpreter` does not find for `binary`.
async fn list_missing(interpreter: &Path, binary: &Path) -> Vec<String> {
    let listing = tokio::process::Command::new(interpreter)
        .arg(binary)
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(LIST_TIMEOUT, listing).await {
        Ok(Ok(out)) => not_found(&String::from_utf8_lossy(&out.stdout)),
        Ok(Err(e)) => {
            tracing::warn!(
                "cannot list the libraries of {} with {}: {e}",
                binary.display(),
                interpreter.display()
            );
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(
                "listing the libraries of {} took over {LIST_TIMEOUT:?}",
                binary.display()
            );
            Vec::new()
        }
    }
}

/// The libraries a loader's listing marks `not found`.
fn not_found(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| line.trim().strip_suffix("=> not found"))
        .map(|name| name.trim().to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_the_libraries_not_found() {
        let listing = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                       \tlibtorch_cpu.so => not found\n\
                       \tlibc10.so => not found\n\
                       \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n";
        assert_eq!(not_found(listing), ["libtorch_cpu.so", "libc10.so"]);
        assert!(not_found("\tstatically linked\n").is_empty());
    }

    #[test]
    fn this_test_binary_has_an_interpreter_and_a_text_file_has_none() {
        let me = std::env::current_exe().unwrap();
        let loader = interpreter(&me).expect("the test binary is dynamic");
        assert!(loader.exists(), "{}", loader.display());
        let text = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(text.path(), b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(interpreter(text.path()), None);
    }

    #[tokio::test]
    async fn this_test_binary_finds_its_libraries() {
        let me = std::env::current_exe().unwrap();
        let checked = Checked::default();
        assert!(checked.missing(&me).await.is_empty());
        assert!(checked.lock().contains(&me));
    }
}
