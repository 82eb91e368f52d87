//! Files and directories nimbus creates hold users' data (objects, spilled
//! objects, logs, shipped programs, collective buffers): they are private
//! to the user that runs nimbus, whatever the umask. Directories are
//! created `0700`, files `0600`; a directory that exists already is left as
//! it is (it is not nimbus's to change).

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

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

/// Creates (or truncates) `path` for writing, `0600` when created.
pub fn private_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(PRIVATE_FILE)
        .open(path)
}

/// Writes `bytes` to a new private file at `path`.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    private_file(path)?.write_all(bytes)
}
