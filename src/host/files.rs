//! Files and directories nimbus creates hold users' data (objects, spilled
//! objects, logs, shipped programs, collective buffers): they are private
//! to the user that runs nimbus, whatever the umask. Directories are
//! created `0700`, files `0600`; a directory that exists already is left as
//! it is (it is not nimbus's to change). The state directory
//! ([`nimbus_home`]) is per user, and a node refuses one that another user
//! owns or can write in ([`own_state_dir`]).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the directories nimbus creates.
pub const PRIVATE_DIR: u32 = 0o700;
/// Mode of the files nimbus creates.
pub const PRIVATE_FILE: u32 = 0o600;

/// Creates `dir` and any missing parents, each `0700`.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
}

/// Creates `dir` (`0700`) when missing and checks that it is a directory
/// of this user that no other user may read or write: one another user
/// made (or a link) is refused, naming its owner and mode.
pub fn private_dir_of_mine(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    private_dir(dir)?;
    let metadata = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let mode = metadata.mode() & 0o7777;
    if !metadata.is_dir() || metadata.uid() != me || mode & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of this user's (uid {me}) alone: owner uid {}, mode {mode:o}{}; remove it",
            dir.display(),
            metadata.uid(),
            if metadata.is_dir() { "" } else { ", not a directory" }
        )));
    }
    Ok(())
}

/// Creates (or truncates) `path` for writing, `0600` when created.
pub fn private_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE)
        .open(path)
}

/// Creates `path` empty and `0600` if missing; if it exists with a mode
/// that lets others read or write it (made by an older nimbus, or under a
/// looser umask by another tool), makes it `0600` and says so in the log.
/// For a file another library then opens itself (the head's redb store),
/// which would create it at the umask's mode.
pub fn private_existing(path: &Path) -> std::io::Result<()> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(PRIVATE_FILE)
        .open(path)?;
    let mode = file.metadata()?.mode() & 0o777;
    if mode & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(PRIVATE_FILE))?;
        tracing::warn!(
            "{} had mode {mode:o}: other users could read it; made it {PRIVATE_FILE:o}",
            path.display()
        );
    }
    Ok(())
}

/// Opens `path` for appending, `0600` when created: a log that more than
/// one writer (a process and its node) adds lines to.
pub fn private_log(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(PRIVATE_FILE)
        .open(path)
}

/// Takes the exclusive advisory lock (`flock`) on `file`, without
/// waiting: `WouldBlock` while another open file holds it. The lock goes
/// with the file's last descriptor, also when its process dies.
pub fn lock_exclusive(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` on a file descriptor this `File` keeps open.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Flushes `dir`'s entries (a file created or renamed in it) to disk.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `bytes` to a new private file at `path`.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    private_file(path)?.write_all(bytes)
}

/// A token file that other users could read or write (a `--token-file`).
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    /// It could not be read.
    #[error("cannot read the token file {path} (--token-file): {source}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Its mode lets other users in.
    #[error("the token file {path} (--token-file) is readable or writable by other users (mode {mode:o}); make it private: chmod 600 {path}")]
    NotPrivate {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It is a symbolic link (whose target another user may change), or
    /// not a regular file.
    #[error("the token file {path} (--token-file) is a symbolic link or not a regular file; give the file itself")]
    NotAFile {
        /// The path given.
        path: PathBuf,
    },
    /// Another user owns it (and could change it).
    #[error("the token file {path} (--token-file) belongs to uid {owner}, not to you (uid {me}); use a file of your own")]
    NotYours {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's user.
        me: u32,
    },
}

/// The text of a token file, refused when other users could read or write
/// it (as ssh refuses such a private key), when another user owns it, or
/// when it is a symbolic link: the token is the cluster's root secret.
/// The checks and the read are on one open descriptor (`O_NOFOLLOW`, then
/// `fstat`), so the file cannot be swapped between them.
pub fn read_token_file(path: &Path) -> Result<String, TokenFileError> {
    use std::io::Read;
    let unreadable = |source| TokenFileError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(TokenFileError::NotAFile {
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(unreadable(e)),
    };
    let metadata = file.metadata().map_err(unreadable)?;
    if !metadata.is_file() {
        return Err(TokenFileError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if metadata.uid() != me {
        return Err(TokenFileError::NotYours {
            path: path.to_path_buf(),
            owner: metadata.uid(),
            me,
        });
    }
    let mode = metadata.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenFileError::NotPrivate {
            path: path.to_path_buf(),
            mode,
        });
    }
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(unreadable)?;
    Ok(text)
}

/// Bytes free for an unprivileged user on the filesystem of `dir`, if the
/// system says and the filesystem has a size (a tmpfs mounted with
/// `size=0` has none: `None`).
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stats` is written by the call
    // before it is read (only when it succeeds).
    let stats = unsafe {
        if libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return None;
        }
        stats.assume_init()
    };
    if stats.f_blocks == 0 {
        return None;
    }
    Some(stats.f_bavail as u64 * stats.f_frsize as u64)
}

/// The record `nimbus start --head` keeps of the head it started on this
/// machine (removed by `nimbus stop`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct HeadRecord {
    /// `HOST:PORT`.
    pub address: String,
}

/// Where [`HeadRecord`] is kept: `head.json` in [`nimbus_home`].
pub fn head_record_path() -> PathBuf {
    nimbus_home().join("head.json")
}

/// The head started on this machine, if one is recorded (it may have died
/// since).
pub fn load_head_record() -> Option<HeadRecord> {
    let bytes = std::fs::read(head_record_path()).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The state directory: `$NIMBUS_HOME`; else `.nimbus` in this user's home
/// (`$HOME`, else the password database's); else `nimbus-UID` in the
/// temporary directory — never a name shared between users.
pub fn nimbus_home() -> PathBuf {
    if let Some(dir) = std::env::var_os("NIMBUS_HOME") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(PathBuf::from)
        .or_else(password_database_home);
    match home {
        Some(home) => home.join(".nimbus"),
        // SAFETY: geteuid cannot fail.
        None => std::env::temp_dir().join(format!("nimbus-{}", unsafe { libc::geteuid() })),
    }
}

/// This user's home directory in the password database.
fn password_database_home() -> Option<PathBuf> {
    let mut buffer = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero `passwd` is a valid out-parameter.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found = std::ptr::null_mut();
    // SAFETY: the buffers outlive the call; `found` points into them or is null.
    let failed = unsafe {
        libc::getpwuid_r(
            libc::geteuid(),
            &mut entry,
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut found,
        )
    };
    if failed != 0 || found.is_null() || entry.pw_dir.is_null() {
        return None;
    }
    // SAFETY: `pw_dir` is a NUL-terminated string inside `buffer`.
    let dir = unsafe { std::ffi::CStr::from_ptr(entry.pw_dir) };
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(dir.to_bytes()));
    (!dir.as_os_str().is_empty()).then_some(dir)
}

/// Why a state directory is not safe to use.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// It could not be created or read.
    #[error("state directory {}: {source}; set NIMBUS_HOME to a directory of yours", path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Another user owns it (or it is a link): they could read or replace
    /// what nimbus keeps there.
    #[error("state directory {} belongs to uid {owner}, not to you (uid {me}), or is a link; set NIMBUS_HOME to a directory of yours", path.display())]
    NotYours {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's user.
        me: u32,
    },
    /// Other users may write in it.
    #[error("state directory {} has mode {mode:o}: other users can write in it; chmod go-w it or set NIMBUS_HOME", path.display())]
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Creates the state directory `dir` (`0700`) when missing, and checks that
/// it is a directory of this user that no one else can write in. One that
/// others can read (a plain `mkdir`: `0755`) is made `0700`, saying so in
/// the log: it holds the cluster's token and keys.
pub fn own_state_dir(dir: &Path) -> Result<(), StateDirError> {
    let io = |source| StateDirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    private_dir(dir).map_err(io)?;
    let metadata = std::fs::symlink_metadata(dir).map_err(io)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !metadata.is_dir() || metadata.uid() != me {
        return Err(StateDirError::NotYours {
            path: dir.to_path_buf(),
            owner: metadata.uid(),
            me,
        });
    }
    let mode = metadata.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StateDirError::Writable {
            path: dir.to_path_buf(),
            mode,
        });
    }
    if mode & 0o077 != 0 {
        let private = mode & !0o077;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(private)).map_err(io)?;
        tracing::warn!(
            "state directory {} had mode {mode:o}: other users could read the cluster's token and keys in it; made it {private:o}",
            dir.display()
        );
    }
    Ok(())
}
