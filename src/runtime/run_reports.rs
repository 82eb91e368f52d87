//! Telling the head what a run does, for the dashboard's training page
//! (`crate::head`'s `runs.rs`): a training run's supervisor
//! (`nimbus-train`) and each trial of a Tune experiment (`crate::tune`)
//! report through a [`RunReporter`].
//!
//! 1. The run turns what it does into `RunEvent`s and queues them
//!    ([`RunReporter::send`]), never waiting on the head.
//! 2. One task sends them in order, in batches of up to `MAX_RUN_EVENTS`
//!    (`JobRequest::RunEvents`); a batch the head does not take is logged
//!    at debug level and dropped (the run's own record is its files).
//! 3. As the run completes, [`RunReporter::finish`] sends what is queued,
//!    waiting at most [`FLUSH_WAIT`].

use std::time::Duration;

use tokio::sync::mpsc;

use super::ProcessContext;
use crate::cluster::{JobRequest, RunEvent, RunHeader, MAX_RUN_EVENTS};

/// The longest a completing run waits for its last events to reach the head.
pub const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// A run's queue of events to the head.
pub struct RunReporter {
    queue: mpsc::UnboundedSender<RunEvent>,
    sender: tokio::task::JoinHandle<()>,
}

impl RunReporter {
    /// Starts reporting run `header` to the head of this process's cluster;
    /// `None` outside a cluster (local mode without `init`). Call it inside
    /// the process's runtime.
    pub fn start(header: RunHeader) -> Option<Self> {
        let context = ProcessContext::current()?;
        let (queue, mut events) = mpsc::unbounded_channel();
        let sender = tokio::spawn(async move {
            while let Some(first) = events.recv().await {
                let mut batch = vec![first];
                while batch.len() < MAX_RUN_EVENTS {
                    match events.try_recv() {
                        Ok(event) => batch.push(event),
                        Err(_) => break,
                    }
                }
                let request = JobRequest::RunEvents {
                    run: header.clone(),
                    events: batch,
                };
                if let Err(e) = context.call_head(request).await {
                    tracing::debug!("the head did not take a batch of run events: {e}");
                }
            }
        });
        Some(RunReporter { queue, sender })
    }

    /// Queues `event`.
    pub fn send(&self, event: RunEvent) {
        let _ = self.queue.send(event);
    }

    /// Sends what is queued, for at most [`FLUSH_WAIT`].
    pub async fn finish(self) {
        let RunReporter { queue, sender } = self;
        drop(queue);
        if tokio::time::timeout(FLUSH_WAIT, sender).await.is_err() {
            tracing::debug!("the run's last events did not reach the head within {FLUSH_WAIT:?}");
        }
    }
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
