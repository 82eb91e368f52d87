//! Where nimbus keeps shared memory on a host: one directory per user
//! under `/dev/shm` ([`user_dir`]), holding
//! - each node's object directory (`nimbus-NODE-PID`, made and removed by
//!   its node), its jobs' large objects in a directory per job
//!   (`job-JOB`, [`job_dir_name`]);
//! - each job's directory for the segments its processes on this host
//!   share (`jobs/job-JOB`, [`job_segments_dir`]: the training
//!   collective's), made by the first that needs it and removed, once
//!   empty, when the job ends (a job whose cluster stopped before it
//!   ended leaves its empty directory).
//!
//! A worker's sandbox covers the per-user directory with an empty tmpfs
//! and binds back only its job's two (`crate::node`'s `sandbox/`), so no
//! job's workers find another job's shared memory.

use std::path::{Path, PathBuf};

/// The host's shared-memory file system.
pub const SHM: &str = "/dev/shm";

/// This user's directory under `shm` (`nimbus-objects-UID`).
pub fn user_dir(shm: &Path) -> PathBuf {
    // SAFETY: geteuid cannot fail.
    shm.join(format!("nimbus-objects-{}", unsafe { libc::geteuid() }))
}

/// The name of `job`'s directory (`job-JOB`); `None` for a job name that
/// is not one plain path component.
pub fn job_dir_name(job: &str) -> Option<String> {
    let plain =
        !job.is_empty() && job != "." && job != ".." && !job.contains('/') && !job.contains('\0');
    plain.then(|| format!("job-{job}"))
}

/// `job`'s directory for the segments its processes on this host share,
/// under `shm`.
pub fn job_segments_dir(shm: &Path, job: &str) -> Option<PathBuf> {
    Some(user_dir(shm).join("jobs").join(job_dir_name(job)?))
}

/// Makes `job`'s segment directory under `shm` (`0700`, in a per-user
/// directory that is this user's alone) and returns it.
pub fn make_job_segments_dir(shm: &Path, job: &str) -> std::io::Result<PathBuf> {
    let dir = job_segments_dir(shm, job).ok_or_else(|| {
        std::io::Error::other(format!("job name {job:?} is not a plain file name"))
    })?;
    super::files::private_dir_of_mine(&user_dir(shm))?;
    super::files::private_dir(&dir)?;
    Ok(dir)
}

/// Removes `job`'s segment directory under `shm` if it is empty (the job
/// ended).
pub fn remove_if_empty(shm: &Path, job: &str) {
    if let Some(dir) = job_segments_dir(shm, job) {
        let _ = std::fs::remove_dir(&dir);
    }
}

/// Removes this user's directory under `shm` once nothing is left in it
/// (a node stops). A job's segment directory is removed only when the job
/// ends ([`remove_if_empty`]): an empty one may still be a running
/// worker's (bound into its sandbox), and removing it would take it from
/// the worker.
pub fn remove_empty(shm: &Path) {
    let user = user_dir(shm);
    let _ = std::fs::remove_dir(user.join("jobs"));
    let _ = std::fs::remove_dir(&user);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_has_a_directory_only_under_a_plain_name() {
        assert_eq!(job_dir_name("a1b2"), Some("job-a1b2".into()));
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert_eq!(job_dir_name(bad), None, "{bad:?}");
        }
        let shm = tempfile::tempdir().unwrap();
        let dir = make_job_segments_dir(shm.path(), "j1").unwrap();
        assert!(dir.is_dir() && dir.starts_with(user_dir(shm.path())));
        std::fs::write(dir.join("segment"), b"x").unwrap();
        remove_if_empty(shm.path(), "j1");
        assert!(dir.is_dir(), "a directory in use stays");
        std::fs::remove_file(dir.join("segment")).unwrap();
        remove_if_empty(shm.path(), "j1");
        assert!(!dir.exists());
        let running = make_job_segments_dir(shm.path(), "j2").unwrap();
        remove_empty(shm.path());
        assert!(running.is_dir(), "a job's directory goes when the job ends");
        remove_if_empty(shm.path(), "j2");
        remove_empty(shm.path());
        assert!(!user_dir(shm.path()).exists());
    }
}
