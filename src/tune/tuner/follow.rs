//! The task that follows one running trial (step 3 of `mod.rs`): it
//! long-polls the trial's results, forwards them to the loop and waits
//! for its decision before the next poll.

use tokio::sync::{mpsc, oneshot};

use super::{Event, DEATH_WAIT, POLL_DEADLINE, POLL_WAIT};
use crate::actor::{self, ActorHandle, CallError};
use crate::tune::config::TuneConfig;
use crate::tune::trial::{
    PollTrial, RunTrial, StopTrial, TrialEnd, TrialProgress, TrialRefusal, TrialRunner,
};

/// Whether `iteration` is the scheduler's `max_t` or beyond (a stop there
/// is the trial's end, not an early stop).
pub(super) fn at_max_t(config: &TuneConfig, iteration: u64) -> bool {
    config
        .scheduler
        .max_t()
        .is_some_and(|max_t| iteration >= max_t)
}

/// Runs one trial on `runner` and forwards its results and end (step 3).
pub(super) async fn follow(
    runner: ActorHandle<TrialRunner>,
    request: RunTrial,
    run: u64,
    events: mpsc::UnboundedSender<Event>,
) {
    let trial = request.trial;
    let started = runner.send_with_deadline(request, POLL_DEADLINE).await;
    if let Err(ended) = reply(&runner, run, started).await {
        let _ = events.send(ended);
        return;
    }
    let mut after = 0;
    loop {
        let poll = PollTrial {
            trial,
            after,
            wait_ms: POLL_WAIT.as_millis() as u64,
        };
        let polled = runner
            .send_with_deadline(poll, POLL_WAIT + POLL_DEADLINE)
            .await;
        let progress: TrialProgress = match reply(&runner, run, polled).await {
            Ok(progress) => progress,
            Err(ended) => {
                let _ = events.send(ended);
                return;
            }
        };
        after += progress.results.len() as u64;
        if !progress.results.is_empty() {
            let (decided, decision) = oneshot::channel();
            if events
                .send(Event::Results(run, progress.results, decided))
                .is_err()
            {
                return;
            }
            match decision.await {
                // Before the poll that lets the trial go on (step 3).
                Ok(true) => {
                    if let Err(e) = runner.do_send(StopTrial { trial }) {
                        tracing::warn!(trial, "cannot stop the trial: {e}");
                    }
                }
                Ok(false) => {}
                Err(_) => return,
            }
        }
        if let Some(end) = progress.end {
            let _ = events.send(Event::Ended(run, Ok(end)));
            return;
        }
    }
}

/// The reply of a call to run `run`'s runner, or the `Ended` event its
/// failure means.
pub(super) async fn reply<T>(
    runner: &ActorHandle<TrialRunner>,
    run: u64,
    call: Result<Result<T, TrialRefusal>, CallError>,
) -> Result<T, Event> {
    match call {
        Ok(Ok(reply)) => Ok(reply),
        Ok(Err(refused)) => Err(Event::Ended(run, Ok(TrialEnd::Refused(refused)))),
        Err(e) => Err(Event::Ended(run, Err(lost(runner, e).await))),
    }
}

/// Why a call to `runner` failed: its death's cause as the head records
/// it (waited for up to [`DEATH_WAIT`]), else the call's error.
pub(super) async fn lost(runner: &ActorHandle<TrialRunner>, error: CallError) -> String {
    let mut after = 0;
    let died = actor::next_death(runner, &mut after);
    match tokio::time::timeout(DEATH_WAIT, died).await {
        Ok(Ok(died)) => format!("its runner died: {}", died.reason),
        _ => format!("its runner was lost: {error}"),
    }
}
