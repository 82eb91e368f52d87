//! Which job's workers may read and change which objects (step 7 of the
//! node store's protocol, `mod.rs`): drivers, the CLI and nodes any.

use std::sync::Arc;

use super::shard::{Fail, OfOtherJobs};
use super::{forbidden, unavailable, NodeObjectStore};
use crate::cluster::{ObjectId, ObjectReply, RefHolder};
use crate::object_store::error::ShardError;
use crate::wire::RemoteError;

impl NodeObjectStore {
    /// Refuses a worker confined to `confined` changing objects of another
    /// job: appending to one, sealing or abandoning it, recording its
    /// failure, taking a reference to it (step 7). Drivers, the CLI and
    /// nodes (`None`) change any, without asking the shards.
    pub(super) async fn may_change(
        &self,
        ids: impl IntoIterator<Item = ObjectId>,
        confined: Option<&str>,
    ) -> Result<(), RemoteError> {
        let others = self.of_other_jobs(ids, confined).await?;
        match (others.first(), confined) {
            (Some(&id), Some(job)) => Err(forbidden(ShardError::OtherJob {
                id,
                job: job.to_string(),
            })),
            _ => Ok(()),
        }
    }

    /// Those of `ids` here that are not of the job a worker is confined to
    /// (`None`: a driver, the CLI or a node, confined to none).
    pub(super) async fn of_other_jobs(
        &self,
        ids: impl IntoIterator<Item = ObjectId>,
        confined: Option<&str>,
    ) -> Result<Vec<ObjectId>, RemoteError> {
        let Some(job) = confined else {
            return Ok(Vec::new());
        };
        let job: Arc<str> = Arc::from(job);
        let mut others = Vec::new();
        for (shard, ids) in self.shards.iter().zip(self.by_shard(ids, |&id| id)) {
            if !ids.is_empty() {
                let job = job.clone();
                let found = shard.send(OfOtherJobs { ids, job }).await;
                others.extend(found.map_err(unavailable)?);
            }
        }
        Ok(others)
    }
}

/// Whether a worker confined to job `confined` (`None`: a driver, the
/// CLI, a node: anyone may) may read object `id` of `job` (step 7).
pub(super) fn may_read(
    id: ObjectId,
    job: Option<&str>,
    confined: Option<&str>,
) -> Result<(), ShardError> {
    match confined {
        Some(confined) if job != Some(confined) => Err(ShardError::OtherJob {
            id,
            job: confined.to_string(),
        }),
        _ => Ok(()),
    }
}

/// `reply` to a worker confined to `confined`: a complete object of
/// another job is refused, and so is the reason another job's task
/// recorded for its failure (step 7).
pub(super) fn readable(
    id: ObjectId,
    reply: ObjectReply,
    confined: Option<&str>,
) -> Result<ObjectReply, RemoteError> {
    match &reply {
        ObjectReply::Ready { job, .. }
        | ObjectReply::Failed {
            job: job @ Some(_), ..
        } => may_read(id, job.as_deref(), confined).map_err(forbidden)?,
        _ => {}
    }
    Ok(reply)
}

/// Object `id`, held by `holder`, failed with `message`, recorded as the
/// job of whoever sent it (`job_of`).
pub(super) fn fail(
    id: ObjectId,
    holder: RefHolder,
    message: String,
    confined: Option<&str>,
) -> Fail {
    let job = job_of(&holder, confined).map(Arc::from);
    Fail {
        id,
        holder,
        message,
        job,
    }
}

/// The job of an object begun or failed by `holder`: the job of the
/// worker that sent it (`confined`), else the job of the driver holding
/// it.
pub(super) fn job_of<'a>(holder: &'a RefHolder, confined: Option<&'a str>) -> Option<&'a str> {
    match (confined, holder) {
        (Some(job), _) => Some(job),
        (None, RefHolder::Process { job, .. }) => job.as_deref(),
        (None, RefHolder::Object(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RemoteErrorKind;

    /// A worker learns why its own job's object failed, and why any object
    /// was lost, but not the reason another job's task recorded.
    #[test]
    fn a_failure_is_told_to_its_own_job() {
        let failed = |job: Option<&str>| ObjectReply::Failed {
            reason: "the task's secret".into(),
            job: job.map(str::to_string),
        };
        let id = ObjectId(7);
        assert!(readable(id, failed(Some("j")), Some("j")).is_ok());
        assert!(readable(id, failed(None), Some("j")).is_ok());
        assert!(readable(id, failed(Some("k")), None).is_ok());
        let refused = readable(id, failed(Some("k")), Some("j")).unwrap_err();
        assert_eq!(refused.kind, RemoteErrorKind::Forbidden);
        assert!(!refused.message.contains("secret"), "{refused:?}");
    }
}
