//! Jobs as an operator sees them (`nimbus job ...`): submitted with their
//! working directory, listed, stopped, their drivers' logs read from the
//! node that runs them. The protocol is in `crate::head`'s `jobs.rs`.

use std::io::Write;
use std::path::Path;

use crate::cluster::{
    sha256_bytes, BinaryId, BinaryRequest, JobRecord, JobRequest, JobSubmission, RunRecord,
    TaskRecord,
};
use crate::cluster::{ControlReply, ControlRequest};
use crate::transport::{Connection, RequestOptions};

use super::{call, unexpected, ClientError, ClusterClient, LogChunk};

/// The largest packed working directory `submit_job` uploads.
pub const MAX_WORKING_DIR: usize = 512 << 20;
/// Bytes per upload request.
const UPLOAD_CHUNK: usize = 8 << 20;

impl ClusterClient {
    /// Every job the head knows, live and ended, oldest first.
    pub async fn jobs(&self) -> Result<Vec<JobRecord>, ClientError> {
        match self
            .call(&ControlRequest::Jobs(JobRequest::ListJobs))
            .await?
        {
            ControlReply::Jobs(jobs) => Ok(jobs),
            reply => Err(unexpected("ListJobs", reply)),
        }
    }

    /// The tasks the head knows (the last 10,000), oldest first.
    pub async fn tasks(&self) -> Result<Vec<TaskRecord>, ClientError> {
        match self
            .call(&ControlRequest::Jobs(JobRequest::ListTasks))
            .await?
        {
            ControlReply::Tasks(tasks) => Ok(tasks),
            reply => Err(unexpected("ListTasks", reply)),
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
        working_dir: Option<&Path>,
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
        match self
            .call(&ControlRequest::Jobs(JobRequest::SubmitJob(submission)))
            .await?
        {
            ControlReply::Job(record) => Ok(*record),
            reply => Err(unexpected("SubmitJob", reply)),
        }
    }

    /// Stops job `id`: its driver gets SIGTERM, then SIGKILL after its
    /// node's grace, and its actors are killed. Answers at once, with the
    /// job as it is then (a submitted job is `STOPPED` once its driver has
    /// exited).
    pub async fn stop_job(&self, id: &str) -> Result<JobRecord, ClientError> {
        let request = ControlRequest::Jobs(JobRequest::StopJob { job: id.into() });
        match self.call(&request).await? {
            ControlReply::Job(record) => Ok(*record),
            reply => Err(unexpected("StopJob", reply)),
        }
    }

    /// The training runs the head knows, without their points.
    pub async fn runs(&self) -> Result<Vec<RunRecord>, ClientError> {
        match self
            .call(&ControlRequest::Jobs(JobRequest::ListRuns))
            .await?
        {
            ControlReply::Runs(runs) => Ok(runs),
            reply => Err(unexpected("ListRuns", reply)),
        }
    }

    /// Training run `id`, with its points.
    pub async fn run(&self, id: &str) -> Result<RunRecord, ClientError> {
        let request = ControlRequest::Jobs(JobRequest::GetRun {
            run: id.to_string(),
        });
        match self.call(&request).await? {
            ControlReply::Run(Some(run)) => Ok(*run),
            ControlReply::Run(None) => Err(ClientError::NotFound {
                what: format!("training run {id}"),
            }),
            reply => Err(unexpected("GetRun", reply)),
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
        let request = ControlRequest::Jobs(JobRequest::ReadJobLog {
            job: job.id.clone(),
            offset,
            max,
        });
        let connection = self.connect_node(&node).await?;
        match call(&connection, &request, RequestOptions::bulk()).await? {
            ControlReply::Log { file, total, bytes } => Ok(LogChunk { file, total, bytes }),
            reply => Err(unexpected("ReadJobLog", reply)),
        }
    }
}

/// `dir` as a tar archive (symbolic links kept as links), at most
/// [`MAX_WORKING_DIR`] bytes.
pub fn pack(dir: &Path) -> Result<Vec<u8>, ClientError> {
    let failed = |detail: String| ClientError::WorkingDir {
        dir: dir.display().to_string(),
        detail,
    };
    if !dir.is_dir() {
        return Err(failed("not a directory".into()));
    }
    let mut builder = tar::Builder::new(Bounded(Vec::new()));
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", dir)
        .and_then(|()| builder.finish())
        .map_err(|e| failed(e.to_string()))?;
    let Bounded(bytes) = builder.into_inner().map_err(|e| failed(e.to_string()))?;
    Ok(bytes)
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
    let has = ControlRequest::Binaries(BinaryRequest::ReadBinary {
        hash: id.hash.clone(),
        offset: 0,
        len: 0,
    });
    if let Ok(ControlReply::BinaryChunk { .. }) = call(node, &has, RequestOptions::control()).await
    {
        return Ok(());
    }
    let mut offset = 0;
    for chunk in bytes.chunks(UPLOAD_CHUNK) {
        let request = ControlRequest::Binaries(BinaryRequest::UploadBinary {
            hash: id.hash.clone(),
            offset,
            total: id.len,
            chunk: chunk.to_vec(),
        });
        call(node, &request, RequestOptions::bulk()).await?;
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
        let packed = pack(dir.path()).unwrap();
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
        let error = pack(&dir.path().join("missing")).unwrap_err();
        assert!(error.to_string().contains("not a directory"), "{error}");
    }
}
