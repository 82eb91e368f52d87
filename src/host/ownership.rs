//! Directories a node owns for its life (spilled objects, shared-memory
//! objects), and the clean-up of those whose owner is provably gone.
//!
//! A node that is killed outright leaves its directories behind; the next
//! node of the same host removes them. `$NIMBUS_HOME` may be on a shared
//! filesystem and `/dev/shm` may be shared between containers (PID
//! namespaces), so "no process with that PID here" proves nothing. The
//! protocol:
//!
//! 1. **Create.** A node creates its directory itself (it must not exist:
//!    an existing one is not provably its own), writes [`OWNER_FILE`] in it
//!    — the host's machine id and boot id, the process's PID and start
//!    time — and holds an exclusive `flock` on that file for its life.
//! 2. **Remove at stop.** The node removes the directory it created.
//! 3. **Clean up at start.** A starting node looks at the directories of
//!    a parent directory with the given name prefix, and removes one only
//!    when all of these hold: its owner file parses (nimbus made it); it
//!    names this machine; the lock on it is free (no live process of any
//!    namespace holds it); and its process is gone (another boot, or no
//!    process with that PID and start time). Anything else is left as it
//!    is: a directory without an owner file was not made by nimbus.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::files::{lock_exclusive as lock, private_dir, PRIVATE_DIR, PRIVATE_FILE};

/// The file in an owned directory that names its owner and carries the
/// owner's lock.
pub const OWNER_FILE: &str = ".nimbus-owner";

/// How many names [`OwnedDir::create_unique`] tries.
pub const UNIQUE_TRIES: u32 = 16;

/// Why a directory could not be made this process's own.
#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    /// The directory exists already: it is not provably this process's.
    #[error("{} exists already, so it is not this node's to use or remove; remove it or choose another directory", .0.display())]
    Exists(PathBuf),
    /// Creating the directory or its owner file failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Who owns a directory: written in its [`OWNER_FILE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The host's `/etc/machine-id` (its hostname when there is none).
    pub machine: String,
    /// The kernel's boot id.
    pub boot: String,
    /// The owning process.
    pub pid: u32,
    /// Its start time, in clock ticks after boot (`/proc/PID/stat`).
    pub start: u64,
}

impl Owner {
    /// This process.
    pub fn me() -> Owner {
        let pid = std::process::id();
        Owner {
            machine: machine_id(),
            boot: boot_id(),
            pid,
            start: start_time(pid).unwrap_or(0),
        }
    }

    /// Whether the owner is provably gone, as seen from `here` (this
    /// process's owner record): same machine, and another boot or no
    /// process with that PID and start time.
    fn gone(&self, here: &Owner) -> bool {
        self.machine == here.machine
            && (self.boot != here.boot || start_time(self.pid) != Some(self.start))
    }
}

/// A directory this process created and owns until it ends.
#[derive(Debug)]
pub struct OwnedDir {
    path: PathBuf,
    /// The open owner file: its `flock` is held while this lives.
    _lock: File,
}

impl OwnedDir {
    /// Creates `path` (`0700`; missing parents too) with its owner file,
    /// locked. Fails if `path` exists.
    pub fn create(path: &Path) -> Result<OwnedDir, OwnershipError> {
        let io = |action, path: &Path| {
            let path = path.to_path_buf();
            move |source| OwnershipError::Io {
                action,
                path,
                source,
            }
        };
        if let Some(parent) = path.parent() {
            private_dir(parent).map_err(io("create", parent))?;
        }
        match std::fs::DirBuilder::new().mode(PRIVATE_DIR).create(path) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(OwnershipError::Exists(path.to_path_buf()))
            }
            created => created.map_err(io("create", path))?,
        }
        let owner_path = path.join(OWNER_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(PRIVATE_FILE)
            .open(&owner_path)
            .map_err(io("create", &owner_path))?;
        lock(&file).map_err(io("lock", &owner_path))?;
        let record = serde_json::to_vec(&Owner::me()).expect("an owner record serializes");
        file.write_all(&record)
            .and_then(|()| file.sync_all())
            .map_err(io("write", &owner_path))?;
        Ok(OwnedDir {
            path: path.to_path_buf(),
            _lock: file,
        })
    }

    /// Creates `path`, or when it exists `path.1`, `path.2`, … (the
    /// first free one of [`UNIQUE_TRIES`]).
    pub fn create_unique(path: &Path) -> Result<OwnedDir, OwnershipError> {
        let mut n = 0;
        loop {
            let mut tried = path.as_os_str().to_os_string();
            if n > 0 {
                tried.push(format!(".{n}"));
            }
            match OwnedDir::create(Path::new(&tried)) {
                Err(OwnershipError::Exists(_)) if n + 1 < UNIQUE_TRIES => n += 1,
                created => return created,
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the directory and everything in it (the lock is held until
    /// this value drops).
    pub fn remove(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            removed => removed,
        }
    }
}

/// Removes the directories under `parent` whose names start with `prefix`
/// and whose owner is provably gone (step 3); returns them.
pub fn remove_stale(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let here = Owner::me();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let named = entry.file_name().to_string_lossy().starts_with(prefix);
        // `file_type` does not follow links: a link is never ours.
        if !named || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if stale(&path, &here) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => removed.push(path),
                Err(e) => tracing::warn!("cannot remove stale {}: {e}", path.display()),
            }
        }
    }
    removed
}

/// Whether `dir` is a directory nimbus made whose owner is provably gone.
fn stale(dir: &Path, here: &Owner) -> bool {
    let Ok(mut file) = OpenOptions::new().read(true).open(dir.join(OWNER_FILE)) else {
        return false;
    };
    let mut record = Vec::new();
    let owner: Option<Owner> = std::io::Read::read_to_end(&mut file, &mut record)
        .ok()
        .and_then(|_| serde_json::from_slice(&record).ok());
    let Some(owner) = owner else {
        return false;
    };
    // The lock is free only when no process anywhere holds it; it is held
    // (by this open file) until the directory is gone.
    owner.gone(here) && lock(&file).is_ok()
}

/// This host's machine id: `/etc/machine-id`, else its hostname.
fn machine_id() -> String {
    ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|id| id.trim().to_string())
        .unwrap_or_default()
}

/// The kernel's boot id (empty where the kernel does not say).
fn boot_id() -> String {
    crate::transport::boot_id().unwrap_or_default().to_string()
}

/// When process `pid` started, in clock ticks after boot; `None` when
/// there is no such process.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command (which may hold spaces and parentheses), field 22
    // of stat(5) is the 20th.
    let after_command = &stat[stat.rfind(')')? + 1..];
    after_command.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_pid_beyond_pid_max_has_none() {
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(u32::MAX), None);
    }

    #[test]
    fn an_owned_directory_is_created_once_and_removed_by_its_owner() {
        let parent = tempfile::tempdir().unwrap();
        let path = parent.path().join("node-1");
        let owned = OwnedDir::create(&path).unwrap();
        assert!(matches!(
            OwnedDir::create(&path),
            Err(OwnershipError::Exists(_))
        ));
        // Its owner lives (this process): it is not stale.
        assert_eq!(remove_stale(parent.path(), ""), Vec::<PathBuf>::new());
        let next = OwnedDir::create_unique(&path).unwrap();
        assert_eq!(next.path(), parent.path().join("node-1.1"));
        owned.remove().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn only_directories_of_gone_owners_of_this_machine_are_removed() {
        let parent = tempfile::tempdir().unwrap();
        let here = Owner::me();
        let write = |name: &str, owner: Option<&Owner>| {
            let dir = parent.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            if let Some(owner) = owner {
                std::fs::write(dir.join(OWNER_FILE), serde_json::to_vec(owner).unwrap()).unwrap();
            }
            dir
        };
        let dead = Owner {
            pid: u32::MAX,
            ..here.clone()
        };
        let rebooted = Owner {
            boot: "an earlier boot".into(),
            ..here.clone()
        };
        let elsewhere = Owner {
            machine: "another machine".into(),
            pid: u32::MAX,
            ..here.clone()
        };
        let gone = write("n-dead", Some(&dead));
        let before_reboot = write("n-rebooted", Some(&rebooted));
        let foreign = write("n-elsewhere", Some(&elsewhere));
        let unmarked = write("n-unmarked", None);
        let other_prefix = write("m-dead", Some(&dead));
        // Held by a live process of another PID namespace: its record
        // names a PID that does not exist here, but its lock is taken.
        let held = OwnedDir::create(&parent.path().join("n-held")).unwrap();
        std::fs::write(
            held.path().join(OWNER_FILE),
            serde_json::to_vec(&dead).unwrap(),
        )
        .unwrap();

        let mut removed = remove_stale(parent.path(), "n-");
        removed.sort();
        assert_eq!(removed, vec![gone, before_reboot]);
        for kept in [&foreign, &unmarked, &other_prefix, held.path()] {
            assert!(kept.is_dir(), "{} was removed", kept.display());
        }
    }
}
