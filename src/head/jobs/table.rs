//! The jobs the head knows, as a plain state machine ([`JobTable`], time
//! passed in), with the checks a submission must pass; the actor that
//! keeps it is `Jobs` (`mod.rs`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::cluster::{valid_job_id, DeathCause, JobRecord, JobState, JobSubmission, Versions};
use crate::head::store::StoredJob;
use crate::wire::NodeIdentity;

/// Ended jobs whose records the head keeps.
pub const MAX_ENDED: usize = 1000;
/// The longest job name the head takes.
const MAX_NAME: usize = 256;

/// Why the head refused a job request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// No job has that id.
    #[error("no job {job} (nimbus job list shows the jobs this head knows)")]
    Unknown {
        /// The id asked for.
        job: String,
    },
    /// The job is over.
    #[error("job {job} has ended already: {state}")]
    Ended {
        /// The job.
        job: String,
        /// How it ended.
        state: JobState,
    },
    /// The submission is not runnable.
    #[error("job submission refused: {0}")]
    BadSubmission(String),
    /// A node reported a job it does not run.
    #[error("node {node} does not run job {job}'s driver")]
    NotItsNode {
        /// The node that reported.
        node: String,
        /// The job.
        job: String,
    },
    /// The head could not record the job in its store.
    #[error("the head could not record job {job} in its store: {detail}")]
    NotRecorded {
        /// The job.
        job: String,
        /// What the store said.
        detail: String,
    },
    /// The node could not start the driver.
    #[error("node {node} could not start job {job}'s driver: {detail}")]
    NotStarted {
        /// The node.
        node: String,
        /// The job.
        job: String,
        /// What went wrong.
        detail: String,
    },
}

/// A job and what the table needs to decide about it.
#[derive(Debug)]
struct Entry {
    record: JobRecord,
    /// When its driver was last heard from (attached jobs).
    heard: Instant,
    /// A stop was asked for (submitted jobs: its driver is being stopped).
    stopping: bool,
}

/// What the head must do to stop a job.
#[derive(Debug, PartialEq, Eq)]
pub enum StopAction {
    /// Ask this node to stop the job's driver; the job ends when it exits.
    StopDriver {
        /// The node.
        node: String,
    },
    /// The job ended now (an attached or a pending job): end it everywhere.
    EndNow,
}

/// The jobs the head knows, as a plain state machine (time passed in:
/// `now` for deadlines, `wall_ms` for the records).
#[derive(Debug, Default)]
pub struct JobTable {
    jobs: HashMap<String, Entry>,
    /// Ended jobs, oldest first, to forget the oldest past [`MAX_ENDED`].
    ended: VecDeque<String>,
    /// Jobs whose records changed since [`JobTable::take_changes`].
    changed: BTreeSet<String>,
    /// Jobs forgotten since [`JobTable::take_changes`].
    forgotten: Vec<String>,
}

impl JobTable {
    /// The table a restarted head had (`head/store.rs`): every live job's
    /// grace starts again at `now`. The submitted jobs whose driver ran on
    /// a node in `lost` (with why it is lost: the previous head, nodes
    /// recorded dead) end now; they are returned with the reason.
    pub fn restore(
        jobs: Vec<StoredJob>,
        lost: &[(NodeIdentity, String)],
        now: Instant,
        wall_ms: u64,
    ) -> (Self, Vec<(String, String)>) {
        let mut table = JobTable::default();
        let mut ended: Vec<(u64, String)> = Vec::new();
        for job in jobs {
            if job.record.state.is_terminal() {
                ended.push((job.record.end_ms.unwrap_or(0), job.record.id.clone()));
            }
            let entry = Entry {
                heard: now,
                stopping: job.stopping,
                record: job.record,
            };
            table.jobs.insert(entry.record.id.clone(), entry);
        }
        ended.sort();
        table.ended = ended.into_iter().map(|(_, id)| id).collect();
        let orphaned: Vec<(String, String)> = table
            .jobs
            .values()
            .filter(|e| e.record.submitted && !e.record.state.is_terminal())
            .filter_map(|e| {
                let node = e.record.node.as_deref()?;
                if let Some((_, why)) = lost.iter().find(|(lost, _)| lost.name == node) {
                    let reason = format!("its driver's node {node} was lost: {why}");
                    return Some((e.record.id.clone(), reason));
                }
                // The head died between recording the job and hearing that
                // its driver started: no one will report on it.
                (e.record.state == JobState::Pending).then(|| {
                    let reason = "the head restarted while its driver was being started (its node is asked to stop it)";
                    (e.record.id.clone(), reason.to_string())
                })
            })
            .collect();
        for (job, reason) in &orphaned {
            table.end(job, JobState::Failed, reason, wall_ms);
        }
        (table, orphaned)
    }

    /// Hands back changes [`JobTable::take_changes`] gave that could not be
    /// written: the next call gives them again.
    pub fn unwritten(&mut self, changed: Vec<StoredJob>, forgotten: Vec<String>) {
        for job in changed {
            if self.jobs.contains_key(&job.record.id) {
                self.changed.insert(job.record.id);
            }
        }
        self.forgotten.extend(forgotten);
    }

    /// The records changed and the jobs forgotten since the last call, to
    /// be written to the head's store.
    pub fn take_changes(&mut self) -> (Vec<StoredJob>, Vec<String>) {
        let changed = std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|id| self.jobs.get(&id))
            .map(|entry| StoredJob {
                record: entry.record.clone(),
                stopping: entry.stopping,
            })
            .collect();
        (changed, std::mem::take(&mut self.forgotten))
    }

    /// Attached step 1-2: `job`'s driver is alive at `now`; false for a job
    /// that ended. An unknown job is recorded as an attached one. What the
    /// driver runs (`versions`) is kept from the first beat that says it.
    pub fn heard(
        &mut self,
        job: &str,
        entrypoint: &str,
        versions: Option<Versions>,
        now: Instant,
        wall_ms: u64,
    ) -> bool {
        match self.jobs.get_mut(job) {
            Some(entry) if entry.record.state.is_terminal() => false,
            Some(entry) => {
                entry.heard = now;
                if entry.record.versions.is_none() && versions.is_some() {
                    entry.record.versions = versions;
                    self.changed.insert(job.to_string());
                }
                true
            }
            None => {
                let record = JobRecord {
                    id: job.to_string(),
                    name: None,
                    submitted: false,
                    entrypoint: entrypoint.to_string(),
                    node: None,
                    state: JobState::Running,
                    message: String::new(),
                    exit: None,
                    driver_pid: None,
                    start_ms: wall_ms,
                    end_ms: None,
                    versions,
                };
                self.insert(record, now);
                true
            }
        }
    }

    /// Attached step 2: the attached jobs silent for longer than `grace` at
    /// `now`, which end now (each once), with the reason.
    pub fn expire(&mut self, now: Instant, grace: Duration, wall_ms: u64) -> Vec<(String, String)> {
        let silent: Vec<String> = self
            .jobs
            .values()
            .filter(|e| !e.record.submitted && !e.record.state.is_terminal())
            .filter(|e| now.saturating_duration_since(e.heard) > grace)
            .map(|e| e.record.id.clone())
            .collect();
        silent
            .into_iter()
            .map(|job| {
                let reason = format!(
                    "its driver was not heard from for {grace:?} (it exited, was killed, or lost the head; --driver-grace-s)"
                );
                self.end(&job, JobState::Failed, &reason, wall_ms);
                (job, reason)
            })
            .collect()
    }

    /// Attached step 3: `job`'s driver ended (`ok`: not in a panic); the
    /// reason the job ends now, if it is a live attached job (a submitted
    /// job ends when its node reports its driver's exit).
    pub fn done(&mut self, job: &str, ok: bool, wall_ms: u64) -> Option<String> {
        let entry = self.jobs.get(job)?;
        if entry.record.submitted || entry.record.state.is_terminal() {
            return None;
        }
        let (state, reason) = match ok {
            true => (JobState::Succeeded, "its driver ended"),
            false => (JobState::Failed, "its driver ended in a panic"),
        };
        self.end(job, state, reason, wall_ms);
        Some(reason.to_string())
    }

    /// Submitted step 1: records a submission as `id`, `PENDING`, to run on
    /// `node`.
    pub fn submit(
        &mut self,
        id: &str,
        submission: &JobSubmission,
        node: &str,
        now: Instant,
        wall_ms: u64,
    ) -> Result<JobRecord, JobError> {
        check(submission)?;
        if !valid_job_id(id) || self.jobs.contains_key(id) {
            return Err(JobError::BadSubmission(format!(
                "job id {id:?} is taken or malformed"
            )));
        }
        let record = JobRecord {
            id: id.to_string(),
            name: submission.name.clone(),
            submitted: true,
            entrypoint: submission.entrypoint.join(" "),
            node: Some(node.to_string()),
            state: JobState::Pending,
            message: String::new(),
            exit: None,
            driver_pid: None,
            start_ms: wall_ms,
            end_ms: None,
            versions: None,
        };
        self.insert(record.clone(), now);
        Ok(record)
    }

    /// Submitted step 1: the node started `job`'s driver as `pid`. False if
    /// the job was stopped meanwhile (the driver must be stopped too).
    pub fn started(&mut self, job: &str, pid: u32) -> bool {
        let Some(entry) = self.jobs.get_mut(job) else {
            return false;
        };
        entry.record.driver_pid = Some(pid);
        self.changed.insert(job.to_string());
        if entry.record.state == JobState::Pending {
            entry.record.state = JobState::Running;
            return true;
        }
        false
    }

    /// Submitted step 1: the node could not start `job`'s driver.
    pub fn start_failed(&mut self, job: &str, why: &str, wall_ms: u64) {
        self.end(job, JobState::Failed, why, wall_ms);
    }

    /// Submitted step 2: `job`'s driver exited from `node`; the reason the
    /// job ends now, if it was live.
    pub fn exited(
        &mut self,
        job: &str,
        node: &str,
        exit: DeathCause,
        wall_ms: u64,
    ) -> Result<Option<String>, JobError> {
        let entry = self.jobs.get_mut(job).ok_or_else(|| JobError::Unknown {
            job: job.to_string(),
        })?;
        if entry.record.node.as_deref() != Some(node) {
            return Err(JobError::NotItsNode {
                node: node.to_string(),
                job: job.to_string(),
            });
        }
        entry.record.exit = Some(exit.clone());
        self.changed.insert(job.to_string());
        if entry.record.state.is_terminal() {
            return Ok(None);
        }
        let (state, reason) = match (&exit, entry.stopping) {
            (_, true) => (
                JobState::Stopped,
                format!("stopped on request; its driver {exit}"),
            ),
            (DeathCause::Exited { code: 0 }, false) => {
                (JobState::Succeeded, "its driver exited with code 0".into())
            }
            (exit, false) => (JobState::Failed, format!("its driver {exit}")),
        };
        self.end(job, state, &reason, wall_ms);
        Ok(Some(reason))
    }

    /// Submitted step 2: the live submitted jobs on node `node`, which died
    /// or left (`why`), end now; they are returned with the reason.
    pub fn node_gone(&mut self, node: &str, why: &str, wall_ms: u64) -> Vec<(String, String)> {
        let on_it: Vec<String> = self
            .jobs
            .values()
            .filter(|e| e.record.submitted && !e.record.state.is_terminal())
            .filter(|e| e.record.node.as_deref() == Some(node))
            .map(|e| e.record.id.clone())
            .collect();
        on_it
            .into_iter()
            .map(|job| {
                let reason = format!("its driver's node {node} {why}");
                self.end(&job, JobState::Failed, &reason, wall_ms);
                (job, reason)
            })
            .collect()
    }

    /// Submitted step 2: the live submitted jobs whose node is not among
    /// `alive`, which end now, with the reason.
    pub fn nodes_lost(&mut self, alive: &[&str], wall_ms: u64) -> Vec<(String, String)> {
        let lost: Vec<(String, String)> = self
            .jobs
            .values()
            .filter(|e| e.record.submitted && !e.record.state.is_terminal())
            .filter_map(|e| {
                let node = e.record.node.as_deref()?;
                (!alive.contains(&node)).then(|| (e.record.id.clone(), node.to_string()))
            })
            .collect();
        lost.into_iter()
            .map(|(job, node)| {
                let reason = format!("its driver's node {node} left the cluster");
                self.end(&job, JobState::Failed, &reason, wall_ms);
                (job, reason)
            })
            .collect()
    }

    /// Step 3: how to stop `job`.
    pub fn stop(&mut self, job: &str, wall_ms: u64) -> Result<StopAction, JobError> {
        let entry = self.jobs.get_mut(job).ok_or_else(|| JobError::Unknown {
            job: job.to_string(),
        })?;
        if entry.record.state.is_terminal() {
            return Err(JobError::Ended {
                job: job.to_string(),
                state: entry.record.state,
            });
        }
        entry.stopping = true;
        self.changed.insert(job.to_string());
        match (&entry.record.node, entry.record.state) {
            (Some(node), JobState::Running) => Ok(StopAction::StopDriver { node: node.clone() }),
            _ => {
                self.end(job, JobState::Stopped, "stopped on request", wall_ms);
                Ok(StopAction::EndNow)
            }
        }
    }

    /// The record of `job`.
    pub fn get(&self, job: &str) -> Option<&JobRecord> {
        self.jobs.get(job).map(|e| &e.record)
    }

    /// Every job, oldest first.
    pub fn list(&self) -> Vec<JobRecord> {
        let mut all: Vec<JobRecord> = self.jobs.values().map(|e| e.record.clone()).collect();
        all.sort_by(|a, b| (a.start_ms, &a.id).cmp(&(b.start_ms, &b.id)));
        all
    }

    fn insert(&mut self, record: JobRecord, now: Instant) {
        self.changed.insert(record.id.clone());
        let entry = Entry {
            record,
            heard: now,
            stopping: false,
        };
        self.jobs.insert(entry.record.id.clone(), entry);
    }

    /// Ends `job` in `state`, and forgets the oldest ended jobs past
    /// [`MAX_ENDED`].
    fn end(&mut self, job: &str, state: JobState, message: &str, wall_ms: u64) {
        let Some(entry) = self.jobs.get_mut(job) else {
            return;
        };
        if entry.record.state.is_terminal() {
            return;
        }
        entry.record.state = state;
        entry.record.message = message.to_string();
        entry.record.end_ms = Some(wall_ms);
        self.changed.insert(job.to_string());
        self.ended.push_back(job.to_string());
        while self.ended.len() > MAX_ENDED {
            if let Some(oldest) = self.ended.pop_front() {
                self.jobs.remove(&oldest);
                self.changed.remove(&oldest);
                self.forgotten.push(oldest);
            }
        }
    }
}

/// Refuses a submission that cannot run, naming what is wrong.
fn check(submission: &JobSubmission) -> Result<(), JobError> {
    let bad = |why: String| Err(JobError::BadSubmission(why));
    match submission.entrypoint.first() {
        None => return bad("no program to run (nimbus job submit -- PROGRAM ARGS...)".into()),
        Some(program) if program.is_empty() => return bad("the program is an empty string".into()),
        Some(_) => {}
    }
    if let Some(arg) = submission.entrypoint.iter().find(|a| a.contains('\0')) {
        return bad(format!("argument {arg:?} holds a NUL byte"));
    }
    if let Some(name) = &submission.name {
        if name.len() > MAX_NAME || name.contains('\0') {
            return bad(format!(
                "the name must be at most {MAX_NAME} bytes without NUL"
            ));
        }
    }
    for (key, value) in &submission.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return bad(format!(
                "environment variable {key:?}: a name needs no '=' or NUL, a value no NUL"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submission(program: &str) -> JobSubmission {
        JobSubmission {
            name: Some("nightly".into()),
            entrypoint: vec![program.into(), "--epochs".into(), "3".into()],
            env: vec![("K".into(), "V".into())],
            working_dir: None,
            node: None,
        }
    }

    #[test]
    fn an_attached_job_ends_once_after_its_grace_and_stays_ended() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(30);
        assert!(table.heard("a", "prog a", None, t0, 1));
        assert!(table.heard("b", "prog b", None, t0, 2));
        assert!(table.heard("a", "prog a", None, t0 + Duration::from_secs(20), 3));
        assert!(
            table.expire(t0 + grace, grace, 4).is_empty(),
            "not past it yet"
        );
        let ended = table.expire(t0 + grace + Duration::from_secs(1), grace, 5);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, "b");
        let b = table.get("b").unwrap();
        assert_eq!(
            (b.state, b.end_ms, b.entrypoint.as_str()),
            (JobState::Failed, Some(5), "prog b")
        );
        assert_eq!(table.get("a").unwrap().state, JobState::Running);
        assert!(table
            .expire(t0 + grace * 2, grace, 6)
            .iter()
            .all(|(job, _)| job == "a"));
        assert!(
            !table.heard("b", "prog b", None, t0 + grace * 3, 7),
            "an ended job stays ended"
        );
        assert!(table.expire(t0 + grace * 9, grace, 8).is_empty());
        assert_eq!(table.list().len(), 2, "ended jobs are still listed");
        assert!(table.heard("d", "prog d", None, t0, 9));
        assert!(table.done("d", true, 9).is_some());
        assert_eq!(table.get("d").unwrap().state, JobState::Succeeded);
        assert!(table.done("d", true, 10).is_none(), "once");
        assert!(table.heard("c", "prog c", None, t0, 11));
        assert!(table.done("c", false, 12).is_some());
        assert_eq!(table.get("c").unwrap().state, JobState::Failed);
        table
            .submit("s", &submission("prog"), "head", t0, 13)
            .unwrap();
        table.started("s", 1);
        assert!(
            table.done("s", true, 14).is_none(),
            "its node reports a submitted driver's end"
        );
    }

    #[test]
    fn a_submitted_job_runs_and_ends_as_its_driver_exits() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        let grace = Duration::from_secs(1);
        let job = table
            .submit("j1", &submission("/bin/prog"), "head", t0, 10)
            .unwrap();
        assert_eq!(
            (job.state, job.entrypoint.as_str()),
            (JobState::Pending, "/bin/prog --epochs 3")
        );
        assert!(table.started("j1", 42));
        assert!(
            table.heard("j1", "", None, t0, 11),
            "its driver's beats are taken"
        );
        assert!(
            table.expire(t0 + grace * 100, grace, 12).is_empty(),
            "a submitted job is watched by its node, not by beats"
        );
        assert_eq!(
            table.exited("j1", "node-2", DeathCause::Exited { code: 0 }, 13),
            Err(JobError::NotItsNode {
                node: "node-2".into(),
                job: "j1".into()
            })
        );
        let ended = table
            .exited("j1", "head", DeathCause::Exited { code: 0 }, 14)
            .unwrap();
        assert!(ended.is_some());
        let record = table.get("j1").unwrap();
        assert_eq!(
            (record.state, record.driver_pid, record.end_ms),
            (JobState::Succeeded, Some(42), Some(14))
        );
        assert_eq!(record.exit_status(), 0);

        table
            .submit("j2", &submission("prog"), "head", t0, 20)
            .unwrap();
        table.started("j2", 43);
        table
            .exited("j2", "head", DeathCause::Exited { code: 3 }, 21)
            .unwrap();
        let record = table.get("j2").unwrap();
        assert_eq!((record.state, record.exit_status()), (JobState::Failed, 3));
        assert!(record.message.contains('3'), "{}", record.message);
        assert_eq!(
            table
                .exited("j2", "head", DeathCause::Exited { code: 0 }, 22)
                .unwrap(),
            None,
            "an ended job ends once"
        );
    }

    #[test]
    fn a_stopped_job_ends_stopped_once_its_driver_exits() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("j", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table.started("j", 7);
        assert_eq!(
            table.stop("j", 2),
            Ok(StopAction::StopDriver {
                node: "node-1".into()
            })
        );
        assert_eq!(
            table.get("j").unwrap().state,
            JobState::Running,
            "until it exits"
        );
        table
            .exited("j", "node-1", DeathCause::Killed { signal: 15 }, 3)
            .unwrap();
        let record = table.get("j").unwrap();
        assert_eq!(
            (record.state, record.exit_status()),
            (JobState::Stopped, 128 + 15)
        );
        assert_eq!(
            table.stop("j", 4),
            Err(JobError::Ended {
                job: "j".into(),
                state: JobState::Stopped
            })
        );
        assert_eq!(
            table.stop("nope", 4),
            Err(JobError::Unknown { job: "nope".into() })
        );

        assert!(table.heard("attached", "prog", None, t0, 5));
        assert_eq!(table.stop("attached", 6), Ok(StopAction::EndNow));
        assert_eq!(table.get("attached").unwrap().state, JobState::Stopped);

        table
            .submit("pending", &submission("prog"), "node-1", t0, 7)
            .unwrap();
        assert_eq!(table.stop("pending", 8), Ok(StopAction::EndNow));
        assert!(
            !table.started("pending", 9),
            "a driver started after its stop is stopped"
        );
    }

    #[test]
    fn jobs_on_a_lost_node_fail_and_bad_submissions_are_refused() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("j", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table.started("j", 7);
        assert!(table.nodes_lost(&["head", "node-1"], 2).is_empty());
        let lost = table.nodes_lost(&["head"], 3);
        assert_eq!(lost.len(), 1);
        assert_eq!(table.get("j").unwrap().state, JobState::Failed);

        let mut bad = submission("prog");
        bad.entrypoint.clear();
        assert!(matches!(
            table.submit("x", &bad, "head", t0, 4),
            Err(JobError::BadSubmission(_))
        ));
        let mut bad = submission("prog");
        bad.env.push(("A=B".into(), "c".into()));
        assert!(matches!(
            table.submit("y", &bad, "head", t0, 4),
            Err(JobError::BadSubmission(_))
        ));
        assert!(
            matches!(
                table.submit("j", &submission("prog"), "head", t0, 4),
                Err(JobError::BadSubmission(_))
            ),
            "an id is used once"
        );
        assert!(matches!(
            table.submit("../j", &submission("prog"), "head", t0, 4),
            Err(JobError::BadSubmission(_))
        ));
    }

    #[test]
    fn only_the_last_ended_jobs_are_kept() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        for i in 0..MAX_ENDED + 5 {
            let job = format!("j{i}");
            assert!(table.heard(&job, "prog", None, t0, i as u64));
            table.stop(&job, i as u64).unwrap();
        }
        assert!(table.heard("live", "prog", None, t0, 0));
        assert_eq!(table.list().len(), MAX_ENDED + 1);
        assert!(table.get("j0").is_none() && table.get("j5").is_some());
    }

    #[test]
    fn what_changed_is_handed_to_the_store_and_a_restored_table_goes_on() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("m", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table
            .submit("h", &submission("prog"), "head", t0, 2)
            .unwrap();
        assert!(table.heard("a", "prog a", None, t0, 3));
        assert!(table.started("m", 41) && table.started("h", 42));
        let (changed, forgotten) = table.take_changes();
        let ids: Vec<&str> = changed.iter().map(|j| j.record.id.as_str()).collect();
        assert_eq!(ids, ["a", "h", "m"]);
        assert!(forgotten.is_empty());
        assert!(table.heard("a", "prog a", None, t0, 4));
        assert!(
            table.take_changes().0.is_empty(),
            "a beat changes no record"
        );
        table.stop("m", 5).unwrap();
        let (changed, _) = table.take_changes();
        assert!(changed.len() == 1 && changed[0].stopping);

        // A change the store did not take is given again.
        table.unwritten(changed, Vec::new());
        let (changed, _) = table.take_changes();
        assert!(changed.len() == 1 && changed[0].stopping);
        // Submitted, not started yet when the head died.
        table
            .submit("p", &submission("prog"), "node-1", t0, 5)
            .unwrap();
        let mut stored = changed;
        stored.extend(["a", "h", "p"].map(|id| StoredJob {
            record: table.get(id).unwrap().clone(),
            stopping: false,
        }));
        let lost = [(
            NodeIdentity {
                name: "head".into(),
                incarnation: crate::wire::Incarnation(1),
            },
            "the head restarted".to_string(),
        )];
        let t1 = t0 + Duration::from_secs(100);
        let (mut restored, mut ended) = JobTable::restore(stored, &lost, t1, 6);
        ended.sort();
        assert_eq!(ended.len(), 2);
        assert_eq!(ended[0].0, "h");
        assert!(ended[0].1.contains("head was lost"), "{}", ended[0].1);
        assert_eq!(ended[1].0, "p");
        assert!(ended[1].1.contains("being started"), "{}", ended[1].1);
        assert_eq!(restored.get("h").unwrap().state, JobState::Failed);
        assert_eq!(restored.get("p").unwrap().state, JobState::Failed);
        assert_eq!(restored.take_changes().0.len(), 2, "the ends are written");
        let grace = Duration::from_secs(30);
        assert!(
            restored.expire(t1 + grace, grace, 7).is_empty(),
            "the grace starts again at the restore"
        );
        let exited = restored.exited("m", "node-1", DeathCause::Exited { code: 0 }, 8);
        assert!(exited.unwrap().unwrap().contains("stopped on request"));
        assert_eq!(restored.get("m").unwrap().state, JobState::Stopped);
    }

    #[test]
    fn the_jobs_of_a_node_that_died_fail_at_once() {
        let mut table = JobTable::default();
        let t0 = Instant::now();
        table
            .submit("x", &submission("prog"), "node-1", t0, 1)
            .unwrap();
        table
            .submit("y", &submission("prog"), "node-2", t0, 1)
            .unwrap();
        assert!(table.started("x", 7) && table.started("y", 8));
        let ended = table.node_gone("node-1", "died: no heartbeat", 2);
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].0, "x");
        assert!(ended[0].1.contains("node-1 died"), "{}", ended[0].1);
        assert_eq!(table.get("y").unwrap().state, JobState::Running);
        assert!(table.node_gone("node-1", "left the cluster", 3).is_empty());
    }
}
