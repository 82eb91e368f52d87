//! Whether a program can load its shared libraries on this machine, asked
//! before a node starts a worker from it: a program built elsewhere (a
//! program that trains looks for libtorch at the path it was built
//! against) must be refused with what is missing named, not die in the
//! dynamic loader with a message that only its log keeps.
//!
//! The check, once per cached binary that passes (`checked`):
//! 1. Read the program's ELF interpreter (`PT_INTERP`, e.g.
//!    `/lib64/ld-linux-x86-64.so.2`). A program without one (static, or
//!    not ELF) loads no libraries: nothing to check.
//! 2. Run the interpreter on the program with `LD_TRACE_LOADED_OBJECTS=1`,
//!    `LD_BIND_NOW` and `LD_WARN` (what `ldd -r` does: the loader lists
//!    every library, found or not, binds every symbol and says which it
//!    could not, then exits without running the program; its `--list`
//!    stops at the first missing library), with the node's environment
//!    (its `LD_LIBRARY_PATH` is the workers'), for at most
//!    [`LIST_TIMEOUT`].
//! 3. What it reports missing is what the program lacks ([`Lacking`]):
//!    libraries `not found`; symbol versions `not found` (a system older
//!    than the build's); undefined symbols (a library of another version
//!    than the program's, e.g. another libtorch at the same path). A
//!    listing that fails otherwise refuses nothing: the worker's own start
//!    then says what went wrong.

use std::collections::HashSet;
use std::fmt;
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

/// The most undefined symbols named in an error.
const SYMBOLS_SHOWN: usize = 3;

/// What a program lacks on this machine to load (step 3).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lacking {
    /// Its dynamic loader, when this machine has none at its path (a
    /// program built on another distribution).
    pub loader: Option<PathBuf>,
    /// Libraries not found.
    pub libraries: Vec<String>,
    /// Symbol versions not found, with what requires each.
    pub versions: Vec<String>,
    /// Symbols no loaded library defines, with the file that needs each.
    pub symbols: Vec<String>,
}

impl Lacking {
    /// Whether nothing is lacking.
    pub fn is_empty(&self) -> bool {
        self.loader.is_none()
            && self.libraries.is_empty()
            && self.versions.is_empty()
            && self.symbols.is_empty()
    }
}

impl fmt::Display for Lacking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = Vec::new();
        if let Some(loader) = &self.loader {
            said.push(format!(
                "its dynamic loader {} is not here",
                loader.display()
            ));
        }
        if !self.libraries.is_empty() {
            said.push(format!(
                "libraries not found: {}",
                self.libraries.join(", ")
            ));
        }
        if !self.versions.is_empty() {
            said.push(format!(
                "symbol versions not found (a system older than the program's build): {}",
                self.versions.join(", ")
            ));
        }
        if !self.symbols.is_empty() {
            let shown: Vec<&str> = self
                .symbols
                .iter()
                .take(SYMBOLS_SHOWN)
                .map(String::as_str)
                .collect();
            said.push(format!(
                "{} undefined symbols (a library of another version than the program was built against), e.g. {}",
                self.symbols.len(),
                shown.join(", ")
            ));
        }
        write!(f, "{}", said.join("; "))
    }
}

/// The binaries that lack nothing here, by path (a cached binary's path
/// names its content), so each is checked once.
#[derive(Clone, Default)]
pub(super) struct Checked(Arc<Mutex<HashSet<PathBuf>>>);

impl Checked {
    /// What `binary` lacks on this machine (nothing when it has it all,
    /// or when the loader cannot tell); steps 1–3.
    pub(super) async fn lacking(&self, binary: &Path) -> Lacking {
        if self.lock().contains(binary) {
            return Lacking::default();
        }
        let lacking = match interpreter(binary) {
            Some(loader) if !loader.exists() => Lacking {
                loader: Some(loader),
                ..Lacking::default()
            },
            Some(loader) if is_glibc_loader(&loader) => list_lacking(&loader, binary).await,
            // Another loader (musl's) may not know LD_TRACE_LOADED_OBJECTS
            // and run the program instead: not asked.
            Some(_) | None => Lacking::default(),
        };
        if lacking.is_empty() {
            self.lock().insert(binary.to_path_buf());
        }
        lacking
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

/// Whether `loader` is glibc's (`ld-linux-x86-64.so.2`,
/// `ld-linux-aarch64.so.1`, `ld64.so.2`), which lists and exits under
/// `LD_TRACE_LOADED_OBJECTS`.
fn is_glibc_loader(loader: &Path) -> bool {
    loader
        .file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("ld-linux") || name.starts_with("ld64.so"))
}

/// Steps 2 and 3: what `interpreter` does not find for `binary`.
async fn list_lacking(interpreter: &Path, binary: &Path) -> Lacking {
    let listing = tokio::process::Command::new(interpreter)
        .arg(binary)
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .env("LD_BIND_NOW", "yes")
        .env("LD_WARN", "yes")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(LIST_TIMEOUT, listing).await {
        Ok(Ok(out)) => lacking(&format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )),
        Ok(Err(e)) => {
            tracing::warn!(
                "cannot list the libraries of {} with {}: {e}",
                binary.display(),
                interpreter.display()
            );
            Lacking::default()
        }
        Err(_) => {
            tracing::warn!(
                "listing the libraries of {} took over {LIST_TIMEOUT:?}",
                binary.display()
            );
            Lacking::default()
        }
    }
}

/// What a loader's listing reports missing: `NAME => not found`,
/// ``…: version `V' not found (required by FILE)``, `undefined symbol:
/// NAME (FILE)`.
fn lacking(listing: &str) -> Lacking {
    let mut found = Lacking::default();
    let mut seen = HashSet::new();
    let mut add = |list: &mut Vec<String>, item: String| {
        if seen.insert(item.clone()) {
            list.push(item);
        }
    };
    for line in listing.lines().map(str::trim) {
        if let Some(name) = line.strip_suffix("=> not found") {
            add(&mut found.libraries, name.trim().to_string());
        } else if let Some((_, rest)) = line.split_once("version `") {
            if let Some((version, required)) = rest.split_once("' not found") {
                add(&mut found.versions, format!("{version}{required}"));
            }
        } else if let Some(symbol) = line.strip_prefix("undefined symbol: ") {
            let symbol = symbol.split_whitespace().collect::<Vec<_>>().join(" ");
            add(&mut found.symbols, symbol);
        }
    }
    // The loader reports every symbol of a library it did not find as
    // undefined too: those say nothing more.
    if !found.libraries.is_empty() {
        found.symbols.clear();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_what_is_not_found() {
        let listing = "\tlinux-vdso.so.1 (0x00007ffc)\n\
                       \tlibtorch_cpu.so => not found\n\
                       \tlibc10.so => not found\n\
                       \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                       ./prog: /lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by ./prog)\n\
                       undefined symbol: _ZN2at4zeros\t(./prog)\n";
        let found = lacking(listing);
        assert_eq!(found.libraries, ["libtorch_cpu.so", "libc10.so"]);
        assert_eq!(found.versions, ["GLIBCXX_3.4.32 (required by ./prog)"]);
        // A missing library's symbols are undefined too: not listed.
        assert_eq!(found.symbols, Vec::<String>::new());
        let another_version = lacking("undefined symbol: _ZN2at4zeros\t(./prog)\n");
        assert_eq!(another_version.symbols, ["_ZN2at4zeros (./prog)"]);
        let said = found.to_string();
        assert!(
            said.starts_with("libraries not found: libtorch_cpu.so, libc10.so; "),
            "{said}"
        );
        assert!(lacking("\tstatically linked\n").is_empty());
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

    /// A program linked against a library of its own (built with `cc`),
    /// then run where that library lacks the symbol it uses, then where
    /// the library is gone.
    #[tokio::test]
    async fn a_library_of_another_version_and_a_missing_one_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let cc = |args: &[&str]| {
            let out = std::process::Command::new("cc")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("cc (a C compiler, which torch-sys's build needs too)");
            assert!(out.status.success(), "cc {args:?}: {out:?}");
        };
        std::fs::write(path("lib.c"), "int needed(void) { return 7; }\n").unwrap();
        std::fs::write(path("other.c"), "int renamed(void) { return 7; }\n").unwrap();
        std::fs::write(
            path("prog.c"),
            "int needed(void);\nint main(void) { return needed(); }\n",
        )
        .unwrap();
        cc(&["-shared", "-fPIC", "-o", "libneeded.so", "lib.c"]);
        cc(&[
            "-o",
            "prog",
            "prog.c",
            "-L.",
            "-lneeded",
            "-Wl,-rpath,$ORIGIN",
        ]);
        let program = path("prog");
        assert!(Checked::default().lacking(&program).await.is_empty());

        // A copy whose loader path names a file that is not here.
        let loader = interpreter(&program).unwrap();
        let old = loader.to_str().unwrap().as_bytes();
        let mut bytes = std::fs::read(&program).unwrap();
        let at = bytes.windows(old.len()).position(|w| w == old).unwrap();
        let gone: Vec<u8> = std::iter::once(b'/')
            .chain(std::iter::repeat_n(b'x', old.len() - 1))
            .collect();
        bytes[at..at + old.len()].copy_from_slice(&gone);
        std::fs::write(path("elsewhere"), bytes).unwrap();
        let lacking = Checked::default().lacking(&path("elsewhere")).await;
        let gone = PathBuf::from(String::from_utf8(gone).unwrap());
        assert_eq!(lacking.loader.as_ref(), Some(&gone), "{lacking}");

        cc(&["-shared", "-fPIC", "-o", "libneeded.so", "other.c"]);
        let lacking = Checked::default().lacking(&program).await;
        assert_eq!(lacking.libraries, Vec::<String>::new());
        assert!(
            lacking.symbols.iter().any(|s| s.starts_with("needed ")),
            "{lacking:?}"
        );

        std::fs::remove_file(path("libneeded.so")).unwrap();
        let lacking = Checked::default().lacking(&program).await;
        assert_eq!(lacking.libraries, ["libneeded.so"]);
        assert_eq!(lacking.symbols, Vec::<String>::new(), "{lacking}");
    }

    #[tokio::test]
    async fn this_test_binary_finds_its_libraries() {
        let me = std::env::current_exe().unwrap();
        let checked = Checked::default();
        assert!(checked.lacking(&me).await.is_empty());
        assert!(checked.lock().contains(&me));
    }
}
