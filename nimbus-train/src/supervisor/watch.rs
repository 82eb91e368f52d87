//! The supervisor's eyes: a task per worker that long-polls its progress
//! and waits for its death, and, for an elastic run below its size, a task
//! that watches for nodes joining.

use std::time::Duration;

use actix::prelude::*;

use super::{NodeJoined, TrainerSupervisor, Watched, WorkerId, WorkerLink, POLL_WAIT};
use crate::worker::PollTraining;
use nimbus::actor;
use nimbus::library;

/// Tells the supervisor of every node that joins, until the attempt ends
/// (its messages are then ignored) or the head is lost.
pub(super) async fn watch_for_room(me: Addr<TrainerSupervisor>, id: u64, mut after: u64) {
    while me.connected() {
        let Ok(events) = library::events(after, Duration::from_secs(30)).await else {
            return;
        };
        after = events.last().map_or(after, |e| e.seq);
        // A `Resync` (events missed: the head restarted) may hide a join.
        let joined = events.iter().any(|e| {
            matches!(
                e.kind,
                nimbus::cluster::ClusterEventKind::NodeJoined { .. }
                    | nimbus::cluster::ClusterEventKind::Resync { .. }
            )
        });
        if joined && me.send(NodeJoined(id)).await.is_err() {
            return;
        }
    }
}

/// Polls one worker's progress until it finishes, fails or dies.
pub(super) async fn watch(
    me: Addr<TrainerSupervisor>,
    worker: WorkerId,
    link: WorkerLink,
    seen: u64,
) {
    let handle = match link {
        WorkerLink::Local(progress) => {
            let mut after = 0;
            loop {
                let report = progress.poll(after, POLL_WAIT).await;
                after += report.events.len() as u64;
                let finished = report.finished.is_some();
                me.do_send(Watched::Progress(worker, report));
                if finished {
                    return;
                }
            }
        }
        WorkerLink::Remote(handle) => handle,
    };
    let mut after = seen;
    let death = actor::next_death(&handle, &mut after);
    tokio::pin!(death);
    let polls = async {
        let mut seen = 0;
        loop {
            let poll = PollTraining {
                after: seen,
                wait_ms: POLL_WAIT.as_millis() as u64,
            };
            match handle
                .send_with_deadline(poll, POLL_WAIT + super::WORKER_CALL_DEADLINE)
                .await
            {
                Ok(Ok(report)) => {
                    seen += report.events.len() as u64;
                    let finished = report.finished.is_some();
                    me.do_send(Watched::Progress(worker, report));
                    if finished {
                        return None;
                    }
                }
                Ok(Err(e)) => return Some(e.to_string()),
                Err(e) => return Some(e.to_string()),
            }
        }
    };
    let lost = tokio::select! {
        died = &mut death => Some(describe_death(died)),
        failed = polls => match failed {
            // Finished: its teardown kill is no failure.
            None => None,
            // A failed call usually means the worker died: prefer its
            // death's reason, if it comes soon.
            Some(call) => Some(
                tokio::time::timeout(Duration::from_secs(5), &mut death)
                    .await
                    .map_or((call, false), describe_death),
            ),
        },
    };
    if let Some((reason, died)) = lost {
        me.do_send(Watched::Failed(worker, reason, died));
    }
}

/// The reason of a death, and whether it is one (`false`: its watch
/// failed).
fn describe_death(died: Result<actor::ActorDied, actor::CallError>) -> (String, bool) {
    match died {
        Ok(died) => (format!("died: {}", died.reason), true),
        Err(e) => (format!("lost track of it: {e}"), false),
    }
}
