//! Jobs as an operator sees them (`nimbus job ...`): submitted with their
//! working directory, listed, stopped, their drivers' logs read from the
//! node that runs them. The protocol is in `crate::head`'s `jobs.rs`.

use std::io::Write;
use std::path::Path;

use crate::cluster::{
    BinaryId, BinaryReply, BinaryRequest, JobRecord, JobReply, JobRequest, JobSubmission,
    RunRecord, TaskRecord, UnexpectedReply,
};
use crate::host::sha256_bytes;
use crate::transport::{Connection, RequestOptions};

use super::{call, ClientError, ClusterClient, LogChunk};

/// The largest packed working directory `submit_job` uploads.
pub const MAX_WORKING_DIR: usize = 512 << 20;
/// What [`pack`] leaves out unless asked: a repository's history (`.git`)
/// and environment files (`.env`, `.env.*`), which hold credentials far
/// more often than anything a driver reads.
pub const PRIVATE_NAMES: &str = ".git, .env, .env.*";

/// A directory shipped with a job (`submit_job`): the driver runs in a copy
/// of it.
#[derive(Clone, Copy, Debug)]
pub struct WorkingDir<'a> {
    /// The directory.
    pub path: &'a Path,
    /// Pack [`PRIVATE_NAMES`] too (left out by default, at any depth).
    pub with_private: bool,
}

impl<'a> WorkingDir<'a> {
    /// `path`, without its private files.
    pub fn new(path: &'a Path) -> Self {
        WorkingDir {
            path,
            with_private: false,
        }
    }
}
/// Bytes per upload request.
const UPLOAD_CHUNK: usize = 8 << 20;

impl ClusterClient {
    /// Every job the head knows, live and ended, oldest first.
    pub async fn jobs(&self) -> Result<Vec<JobRecord>, ClientError> {
        match self.call(JobRequest::ListJobs).await? {
            JobReply::Jobs(jobs) => Ok(jobs),
            reply => Err(UnexpectedReply::new("ListJobs", reply).into()),
        }
    }

    /// The tasks the head knows (the last 10,000), oldest first.
    pub async fn tasks(&self) -> Result<Vec<TaskRecord>, ClientError> {
        match self.call(JobRequest::ListTasks).await? {
            JobReply::Tasks(tasks) => Ok(tasks),
            reply => Err(UnexpectedReply::new("ListTasks", reply).into()),
        }
    }

    /// The job `id`.
    pub async fn job(&self, id: &str) -> Result<JobRecord, ClientError> {
        self.jobs()
            .await?
            .into_iter()
            .find(|job| job.id == id)
            .ok_or_else(|| ClientError::NotFound {
                what: format!("job {id}"),
            })
    }

    /// Runs a driver program on a node (the head's unless `submission`
    /// names one), with `working_dir` packed and uploaded to that node
    /// first: answers once the driver runs.
    pub async fn submit_job(
        &self,
        mut submission: JobSubmission,
        working_dir: Option<WorkingDir<'_>>,
    ) -> Result<JobRecord, ClientError> {
        let status = self.status().await?;
        let node = match &submission.node {
            Some(name) => status.alive().find(|n| &n.id == name),
            None => status.alive().find(|n| n.head),
        }
        .ok_or_else(|| ClientError::NotFound {
            what: format!(
                "alive node {} to run the job on",
                submission.node.as_deref().unwrap_or("(the head)")
            ),
        })?
        .clone();
        submission.node = Some(node.id.clone());
        if let Some(dir) = working_dir {
            let packed = pack(dir)?;
            let id = BinaryId {
                hash: sha256_bytes(&packed),
                len: packed.len() as u64,
            };
            upload(&self.connect_node(&node).await?, &id, &packed).await?;
            submission.working_dir = Some(id);
        }
        match self.call(JobRequest::SubmitJob(submission)).await? {
            JobReply::Job(record) => Ok(*record),
            reply => Err(UnexpectedReply::new("SubmitJob", reply).into()),
        }
    }

    /// Stops job `id`: its driver gets SIGTERM, then SIGKILL after its
    /// node's grace, and its actors are killed. Answers at once, with the
    /// job as it is then (a submitted job is `STOPPED` once its driver has
    /// exited).
    pub async fn stop_job(&self, id: &str) -> Result<JobRecord, ClientError> {
        let request = JobRequest::StopJob { job: id.into() };
        match self.call(request).await? {
            JobReply::Job(record) => Ok(*record),
            reply => Err(UnexpectedReply::new("StopJob", reply).into()),
        }
    }

    /// The training runs the head knows, without their points.
    pub async fn runs(&self) -> Result<Vec<RunRecord>, ClientError> {
        match self.call(JobRequest::ListRuns).await? {
            JobReply::Runs(runs) => Ok(runs),
            reply => Err(UnexpectedReply::new("ListRuns", reply).into()),
        }
    }

    /// Training run `id`, with its points.
    pub async fn run(&self, id: &str) -> Result<RunRecord, ClientError> {
        let request = JobRequest::GetRun {
            run: id.to_string(),
        };
        match self.call(request).await? {
            JobReply::Run(Some(run)) => Ok(*run),
            JobReply::Run(None) => Err(ClientError::NotFound {
                what: format!("training run {id}"),
            }),
            reply => Err(UnexpectedReply::new("GetRun", reply).into()),
        }
    }

    /// Up to `max` bytes from `offset` of the log (stdout and stderr) of
    /// submitted job `job`'s driver, read on its node.
    pub async fn read_job_log(
        &self,
        job: &JobRecord,
        offset: u64,
        max: u64,
    ) -> Result<LogChunk, ClientError> {
        let name = job.node.as_deref().ok_or_else(|| ClientError::NotFound {
            what: format!(
                "log of job {}: its driver attached by itself, its output is where it ran",
                job.id
            ),
        })?;
        let node =
            self.status()
                .await?
                .node(name)
                .cloned()
                .ok_or_else(|| ClientError::NotFound {
                    what: format!("node {name} of job {}", job.id),
                })?;
        let request = JobRequest::ReadJobLog {
            job: job.id.clone(),
            offset,
            max,
        };
        let connection = self.connect_node(&node).await?;
        match call(&connection, request, RequestOptions::bulk()).await? {
            JobReply::Log(chunk) => Ok(chunk),
            reply => Err(UnexpectedReply::new("ReadJobLog", reply).into()),
        }
    }
}

/// `dir` as a tar archive (symbolic links kept as links, entries in name
/// order, so the same files pack to the same bytes and upload once), at
/// most [`MAX_WORKING_DIR`] bytes.
pub fn pack(dir: WorkingDir<'_>) -> Result<Vec<u8>, ClientError> {
    let failed = |detail: String| ClientError::WorkingDir {
        dir: dir.path.display().to_string(),
        detail,
    };
    if !dir.path.is_dir() {
        return Err(failed("not a directory".into()));
    }
    let mut builder = tar::Builder::new(Bounded(Vec::new()));
    builder.follow_symlinks(false);
    append_tree(&mut builder, dir.path, Path::new(""), dir.with_private)
        .and_then(|()| builder.finish())
        .map_err(|e| failed(e.to_string()))?;
    let Bounded(bytes) = builder.into_inner().map_err(|e| failed(e.to_string()))?;
    Ok(bytes)
}

/// Appends what `dir` holds as `inside/...`, depth first, in name order,
/// leaving out [`PRIVATE_NAMES`] unless `with_private`.
fn append_tree(
    builder: &mut tar::Builder<Bounded>,
    dir: &Path,
    inside: &Path,
    with_private: bool,
) -> std::io::Result<()> {
    let mut entries = std::fs::read_dir(dir)?.collect::<Result<Vec<_>, _>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let name = entry.file_name();
        if !with_private && is_private(&name.to_string_lossy()) {
            continue;
        }
        let (path, name) = (entry.path(), inside.join(&name));
        if entry.file_type()?.is_dir() {
            builder.append_dir(&name, &path)?;
            append_tree(builder, &path, &name, with_private)?;
        } else {
            builder.append_path_with_name(&path, &name)?;
        }
    }
    Ok(())
}

/// Whether a file named `name` is one of [`PRIVATE_NAMES`].
fn is_private(name: &str) -> bool {
    name == ".git" || name == ".env" || name.starts_with(".env.")
}

/// A buffer that refuses to grow past [`MAX_WORKING_DIR`].
struct Bounded(Vec<u8>);

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_WORKING_DIR {
            return Err(std::io::Error::other(format!(
                "larger than {} MiB packed: move data the job reads to shared storage",
                MAX_WORKING_DIR >> 20
            )));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Uploads `bytes` as `id` to the node on `node`, unless it has them.
async fn upload(node: &Connection, id: &BinaryId, bytes: &[u8]) -> Result<(), ClientError> {
    let has = BinaryRequest::ReadBinary {
        hash: id.hash.clone(),
        offset: 0,
        len: 0,
    };
    if let Ok(BinaryReply::Chunk { .. }) = call(node, has, RequestOptions::control()).await {
        return Ok(());
    }
    let mut offset = 0;
    for chunk in bytes.chunks(UPLOAD_CHUNK) {
        let request = BinaryRequest::UploadBinary {
            hash: id.hash.clone(),
            offset,
            total: id.len,
            chunk: chunk.to_vec(),
        };
        call(node, request, RequestOptions::bulk()).await?;
        offset += chunk.len() as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_packs_with_its_files_and_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data.txt"), b"payload").unwrap();
        std::os::unix::fs::symlink("sub/data.txt", dir.path().join("link")).unwrap();
        let packed = pack(WorkingDir::new(dir.path())).unwrap();
        let mut archive = tar::Archive::new(&packed[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            seen.push((
                entry.path().unwrap().display().to_string(),
                entry.header().entry_type().is_symlink(),
            ));
        }
        assert!(seen.contains(&("sub/data.txt".into(), false)), "{seen:?}");
        assert!(seen.contains(&("link".into(), true)), "{seen:?}");
        let missing = dir.path().join("missing");
        let error = pack(WorkingDir::new(&missing)).unwrap_err();
        assert!(error.to_string().contains("not a directory"), "{error}");
    }

    /// Names in an archive.
    fn names(packed: &[u8]) -> Vec<String> {
        let mut archive = tar::Archive::new(packed);
        let entries = archive.entries().unwrap();
        let name = |entry: std::io::Result<tar::Entry<&[u8]>>| {
            entry.unwrap().path().unwrap().display().to_string()
        };
        entries.map(name).collect()
    }

    /// A repository's history and its environment files, at any depth, stay
    /// behind unless asked for; the rest packs in name order, the same
    /// bytes each time. Before, `.git` and `.env` were shipped to the node.
    #[test]
    fn private_files_stay_behind_unless_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in [".git", "app", "app/.git"] {
            std::fs::create_dir(root.join(sub)).unwrap();
        }
        let private = [
            ".git/config",
            ".env",
            ".env.local",
            "app/.env",
            "app/.git/HEAD",
        ];
        for file in private
            .iter()
            .chain(&["app/main.py", ".envrc.example", "b.txt"])
        {
            std::fs::write(root.join(file), file).unwrap();
        }
        let packed = pack(WorkingDir::new(root)).unwrap();
        assert_eq!(
            names(&packed),
            [".envrc.example", "app", "app/main.py", "b.txt"],
        );
        assert_eq!(pack(WorkingDir::new(root)).unwrap(), packed, "reproducible");
        let everything = WorkingDir {
            path: root,
            with_private: true,
        };
        let all = names(&pack(everything).unwrap());
        for file in private {
            assert!(all.iter().any(|n| n == file), "{file}: {all:?}");
        }
    }
}
