//! What this machine and process say of themselves: their CPUs and
//! memory, the NVIDIA driver's version file, the process's mapped files,
//! and the release files beside a library. Reading only; the cluster's
//! types parse what these say (`crate::cluster`'s `resources.rs` and
//! `versions.rs`).

use std::path::Path;

/// Where the NVIDIA kernel driver says its version.
const NVIDIA_VERSION_FILE: &str = "/proc/driver/nvidia/version";
/// Where a process's mapped files are listed.
const MAPS: &str = "/proc/self/maps";
/// Where the kernel says how much memory the machine has.
const MEMINFO: &str = "/proc/meminfo";

/// The CPUs this process may run on (1 when that cannot be known).
pub fn cpus() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get() as f64)
        .unwrap_or(1.0)
}

/// Total memory from `/proc/meminfo`, or 0 where it cannot be read.
pub fn memory_bytes() -> u64 {
    let meminfo = std::fs::read_to_string(MEMINFO).unwrap_or_default();
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

/// The NVIDIA kernel driver's version file, if the machine has one.
pub fn nvidia_version_file() -> Option<String> {
    std::fs::read_to_string(NVIDIA_VERSION_FILE).ok()
}

/// This process's mapped files (`/proc/self/maps`).
pub fn mapped_files() -> Option<String> {
    std::fs::read_to_string(MAPS).ok()
}

/// The text of `name` in `directory`, if it can be read.
pub fn file_beside(directory: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(directory.join(name)).ok()
}
