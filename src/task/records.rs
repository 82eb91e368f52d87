//! What this process's tasks are doing, for `nimbus list tasks`
//! (`crate::head`'s `tasks.rs` keeps them):
//!
//! 1. Each task's state is recorded here as it changes: `PENDING` at
//!    submission, `RUNNING` at each attempt (with its task worker),
//!    `FINISHED` or `FAILED` (with the error) at its end; only the latest
//!    state of each is kept until reported.
//! 2. Every [`REPORT_EVERY`] (1 s) the latest states are sent to the head
//!    (`TaskStates`, at most `MAX_TASK_STATES` per request), so a task that
//!    starts and ends within a second costs one record, and submitting
//!    costs no round trip. A failed report is dropped (the listing is
//!    informative; the tasks run on).
//! 3. A driver that ends hands over what is left (`take_unreported`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cluster::{ActorId, JobRequest, ObjectId, TaskRecord, TaskState, MAX_TASK_STATES};
use crate::runtime::ProcessContext;

/// How often the latest states are reported.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// This process's task reports, kept in its context
/// (`ProcessContext::extension`).
#[derive(Default)]
struct Reports {
    /// The states not reported yet, by task.
    unreported: Mutex<HashMap<ObjectId, TaskRecord>>,
    /// Set once reporting runs (step 2).
    started: OnceLock<()>,
}

/// Step 3: the states `context`'s process has not reported yet, taken.
pub fn take_unreported(context: &ProcessContext) -> Vec<TaskRecord> {
    match context.extension::<Reports>().unreported.lock() {
        Ok(mut pending) => pending.drain().map(|(_, record)| record).collect(),
        Err(_) => Vec::new(),
    }
}

/// One task's record, kept up to date through its life (step 1).
pub(super) struct Tracked {
    /// Where its states go until reported.
    reports: Arc<Reports>,
    record: TaskRecord,
    /// When it was submitted, for `nimbus_task_seconds`.
    since: std::time::Instant,
}

impl Tracked {
    /// A task of `name` just submitted by `context`'s job, its result
    /// `id`: `PENDING`.
    pub(super) fn submitted(context: &'static ProcessContext, id: ObjectId, name: &str) -> Self {
        start_reporting(context);
        metrics::counter!("nimbus_tasks_submitted_total").increment(1);
        let tracked = Tracked {
            reports: context.extension(),
            since: std::time::Instant::now(),
            record: TaskRecord {
                id,
                name: name.to_string(),
                job: context.job.clone(),
                state: TaskState::Pending,
                worker: None,
                attempts: 0,
                error: None,
                submitted_ms: wall_ms(),
                ended_ms: None,
            },
        };
        tracked.record();
        tracked
    }

    /// An attempt starts on `worker`.
    pub(super) fn running(&mut self, worker: ActorId) {
        self.record.state = TaskState::Running;
        self.record.worker = Some(worker);
        self.record.attempts += 1;
        if self.record.attempts > 1 {
            metrics::counter!("nimbus_task_retries_total").increment(1);
        }
        self.record();
    }

    /// The task ended: `FINISHED`, or `FAILED` with `error`.
    pub(super) fn ended(mut self, error: Option<String>) {
        self.record.state = match error {
            None => TaskState::Finished,
            Some(_) => TaskState::Failed,
        };
        let outcome = if error.is_none() { "ok" } else { "failed" };
        metrics::counter!("nimbus_tasks_finished_total", "outcome" => outcome).increment(1);
        metrics::histogram!("nimbus_task_seconds").record(self.since.elapsed().as_secs_f64());
        self.record.error = error;
        self.record.ended_ms = Some(wall_ms());
        self.record();
    }

    fn record(&self) {
        if let Ok(mut pending) = self.reports.unreported.lock() {
            pending.insert(self.record.id, self.record.clone());
        }
    }
}

/// Step 2, started once per process.
fn start_reporting(context: &'static ProcessContext) {
    context.extension::<Reports>().started.get_or_init(|| {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REPORT_EVERY);
            loop {
                tick.tick().await;
                let states = take_unreported(context);
                for batch in states.chunks(MAX_TASK_STATES) {
                    let report = JobRequest::TaskStates(batch.to_vec());
                    if let Err(e) = context.call_head(report).await {
                        tracing::debug!("task states not reported: {e}");
                    }
                }
            }
        });
    });
}

/// Milliseconds since the Unix epoch.
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
