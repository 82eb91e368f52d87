//! What the CLI remembers between commands, under `$NIMBUS_HOME`
//! (default `~/.nimbus`): the head's address and token, and a record per
//! node process started on this machine (for `nimbus stop`).

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::host::files::{
    head_record_path, load_head_record, private_dir, private_file, HeadRecord,
};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// The state directory.
pub(crate) fn home() -> PathBuf {
    crate::host::files::nimbus_home()
}

/// Where the head started on this machine keeps its token (mode 0600).
pub(crate) fn token_file() -> PathBuf {
    home().join("token")
}

/// Where the head started on this machine keeps its dashboard's URL, with
/// the secret a loopback dashboard asks for (mode 0600).
pub(crate) fn dashboard_url_file() -> PathBuf {
    home().join("dashboard-url")
}

/// Saves the dashboard's URL (a line).
pub(crate) fn save_dashboard_url(url: &str) -> Result<()> {
    write_private(&dashboard_url_file(), format!("{url}\n").as_bytes())
}

/// Saves the dashboard's sign-in credential, for a dashboard beyond
/// loopback (mode 0600).
pub(crate) fn save_dashboard_credential(credential: &str) -> Result<()> {
    let file = home().join("dashboard-credential");
    write_private(&file, format!("{credential}\n").as_bytes())
}

/// A node process started on this machine.
#[derive(Serialize, Deserialize)]
pub(crate) struct NodeRecord {
    /// Its pid.
    pub pid: u32,
    /// Its node name.
    pub name: String,
}

/// Saves the head's address and token.
pub(crate) fn save_head(address: &str, token: &str) -> Result<()> {
    write_private(&token_file(), token.as_bytes())?;
    let record = serde_json::to_vec(&HeadRecord {
        address: address.to_string(),
    })?;
    write_private(&head_record_path(), &record)
}

/// The head saved by [`save_head`], if any.
pub(crate) fn load_head() -> Option<HeadRecord> {
    load_head_record()
}

/// Records a running node process.
pub(crate) fn save_node(record: &NodeRecord) -> Result<PathBuf> {
    let path = nodes_dir().join(format!("{}.json", record.pid));
    write_private(&path, &serde_json::to_vec(record)?)?;
    Ok(path)
}

/// Every recorded node process.
pub(crate) fn load_nodes() -> Vec<(PathBuf, NodeRecord)> {
    let Ok(entries) = fs::read_dir(nodes_dir()) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let record = serde_json::from_slice(&fs::read(&path).ok()?).ok()?;
            Some((path, record))
        })
        .collect()
}

/// A fresh log file for a background process, `KIND-MILLIS.log`
/// (`node`, `autoscaler`).
pub(crate) fn new_log_file(kind: &str) -> Result<(PathBuf, fs::File)> {
    let dir = home().join("logs");
    private_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let path = dir.join(format!("{kind}-{stamp}.log"));
    let file = private_file(&path).with_context(|| format!("cannot create {}", path.display()))?;
    Ok((path, file))
}

fn nodes_dir() -> PathBuf {
    home().join("nodes")
}

/// The last `lines` lines of the log at `path` (none if it cannot be read).
pub(crate) fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let log = fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Writes `bytes` to `path` (mode 0600, its directory 0700) in one rename.
pub(crate) fn write_private(path: &PathBuf, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent() {
        private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
