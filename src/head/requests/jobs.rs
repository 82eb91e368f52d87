//! Job requests on the head: drivers' liveness and exits, submitted jobs,
//! stopping them, the task and training-run tables (`crate::head::jobs`).

use crate::cluster::{JobReply, JobRequest};
use crate::head::{jobs, HeadActors};
use crate::transport::Caller;
use crate::wire::{RemoteError, RemoteErrorKind};

use super::unavailable;

impl HeadActors {
    /// Answers a job request (those a node answers, `EndJob`, `RunDriver`,
    /// `StopDriver`, `ReadJobLog`, are refused here).
    pub async fn answer_jobs(
        &self,
        from: Caller,
        request: JobRequest,
    ) -> Result<JobReply, RemoteError> {
        let refused =
            |e: jobs::JobError| RemoteError::new(RemoteErrorKind::BadRequest, e.to_string());
        let jobs = &self.jobs;
        match request {
            JobRequest::DriverAlive {
                job,
                entrypoint,
                versions,
            } => {
                if !crate::cluster::valid_job_id(&job) {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!("job id {job:?} is malformed: 1 to {} letters, digits, '-' or '_' (NIMBUS_JOB_ID)", crate::cluster::MAX_JOB_ID),
                    ));
                }
                let entrypoint = crate::cluster::bounded_text(entrypoint);
                let alive = jobs
                    .send(jobs::DriverAlive {
                        job: job.clone(),
                        entrypoint,
                        versions: versions.map(crate::cluster::Versions::bounded),
                    })
                    .await
                    .map_err(unavailable)?;
                match alive {
                    true => Ok(JobReply::Ack),
                    false => Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!("job {job} has ended (nimbus job status {job} says why), and its actors were killed"),
                    )),
                }
            }
            JobRequest::DriverDone { job, ok } => {
                jobs.send(jobs::DriverDone { job, ok })
                    .await
                    .map_err(unavailable)?;
                Ok(JobReply::Ack)
            }
            JobRequest::SubmitJob(submission) => {
                let record = jobs
                    .send(jobs::Submit(submission))
                    .await
                    .map_err(unavailable)?
                    .map_err(refused)?;
                Ok(JobReply::Job(Box::new(record)))
            }
            JobRequest::StopJob { job } => {
                let record = jobs
                    .send(jobs::Stop(job))
                    .await
                    .map_err(unavailable)?
                    .map_err(refused)?;
                Ok(JobReply::Job(Box::new(record)))
            }
            JobRequest::ListJobs => Ok(JobReply::Jobs(
                jobs.send(jobs::List).await.map_err(unavailable)?,
            )),
            JobRequest::TaskStates(records) => {
                if records.len() > crate::cluster::MAX_TASK_STATES {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!(
                            "{} task states in one report; at most {}",
                            records.len(),
                            crate::cluster::MAX_TASK_STATES
                        ),
                    ));
                }
                jobs.send(jobs::TaskStates(records))
                    .await
                    .map_err(unavailable)?;
                Ok(JobReply::Ack)
            }
            JobRequest::ListTasks => {
                let mut tasks = jobs.send(jobs::ListTasks).await.map_err(unavailable)?;
                // A worker sees its own job's tasks only: their ids are their
                // result objects' (`authorize.rs`).
                if let Some(scope) = from.worker_scope() {
                    tasks.retain(|task| task.job == scope.job);
                }
                Ok(JobReply::Tasks(tasks))
            }
            JobRequest::RunEvents { run, events } => {
                if events.len() > crate::cluster::MAX_RUN_EVENTS {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!(
                            "{} run events in one report; at most {}",
                            events.len(),
                            crate::cluster::MAX_RUN_EVENTS
                        ),
                    ));
                }
                jobs.send(jobs::RunEvents(run, events))
                    .await
                    .map_err(unavailable)?;
                Ok(JobReply::Ack)
            }
            JobRequest::ListRuns => Ok(JobReply::Runs(
                jobs.send(jobs::ListRuns).await.map_err(unavailable)?,
            )),
            JobRequest::GetRun { run } => Ok(JobReply::Run(
                jobs.send(jobs::GetRun(run))
                    .await
                    .map_err(unavailable)?
                    .map(Box::new),
            )),
            JobRequest::DriverExited { job, exit } => {
                let exited = jobs::Exited {
                    job,
                    node: from.peer.identity.name.clone(),
                    exit,
                };
                jobs.send(exited)
                    .await
                    .map_err(unavailable)?
                    .map_err(refused)?;
                Ok(JobReply::Ack)
            }
            JobRequest::EndJob { .. }
            | JobRequest::RunDriver { .. }
            | JobRequest::StopDriver { .. }
            | JobRequest::ReadJobLog { .. } => Err(RemoteError::new(
                RemoteErrorKind::Internal,
                "a node's job request reached the head's dispatcher",
            )),
        }
    }
}
