//! Check helpers for fault-injection tests: wait for a condition with a
//! deadline, and check an invariant continuously while a workload runs.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::sync::atomic::{AtomicI64, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use nimbus::testing::check::{wait_until, Invariant};
//!
//! let total = Arc::new(AtomicI64::new(100));
//! let seen = total.clone();
//! let invariant = Invariant::watch("total is 100", Duration::from_millis(5), move || {
//!     let t = seen.load(Ordering::SeqCst);
//!     if t == 100 { Ok(()) } else { Err(format!("total is {t}")) }
//! });
//! // ... the workload runs here, under faults ...
//! let checks = invariant.finish().await.unwrap();
//! assert!(checks >= 1);
//! wait_until("the total is positive", Duration::from_secs(1), || async {
//!     (total.load(Ordering::SeqCst) > 0).then_some(())
//! }).await.unwrap();
//! # }
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// A check failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The condition did not hold before the deadline.
    #[error("{what} did not happen within {after:?}")]
    Deadline {
        /// The condition.
        what: String,
        /// The deadline.
        after: Duration,
    },
    /// The invariant was violated.
    #[error("invariant \"{name}\" violated after {checks} checks ({at:?} in): {detail}")]
    Violated {
        /// The invariant.
        name: String,
        /// Checks that passed before.
        checks: u64,
        /// When, after the watch started.
        at: Duration,
        /// What the check said.
        detail: String,
    },
}

/// Polls `condition` (every 10 ms at first, backing off to 200 ms) until
/// it yields a value or `deadline` passes. For conditions with no event to
/// wait on (state read through calls); wait on events where there is one.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    deadline: Duration,
    mut condition: F,
) -> Result<T, CheckError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(value) = condition().await {
            return Ok(value);
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(CheckError::Deadline {
                what: what.to_string(),
                after: deadline,
            });
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// An invariant checked every `period` on a task of its own until
/// [`finish`](Invariant::finish); the first violation ends the watch.
pub struct Invariant {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<u64, CheckError>>,
}

impl Invariant {
    /// Starts checking `check` (`Err` describes a violation).
    pub fn watch<E: std::fmt::Display>(
        name: &str,
        period: Duration,
        mut check: impl FnMut() -> Result<(), E> + Send + 'static,
    ) -> Self {
        let (stop, mut stopped) = oneshot::channel();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut checks = 0;
            loop {
                if let Err(detail) = check() {
                    return Err(CheckError::Violated {
                        name,
                        checks,
                        at: started.elapsed(),
                        detail: detail.to_string(),
                    });
                }
                checks += 1;
                tokio::select! {
                    _ = &mut stopped => return Ok(checks),
                    _ = tokio::time::sleep(period) => {}
                }
            }
        });
        Invariant {
            stop: Some(stop),
            task,
        }
    }

    /// Stops watching after one last check; the number of checks that
    /// passed, or the first violation.
    pub async fn finish(mut self) -> Result<u64, CheckError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(e) => Err(CheckError::Violated {
                name: "the invariant's check".into(),
                checks: 0,
                at: Duration::ZERO,
                detail: format!("panicked: {e}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_violation_is_caught_while_it_lasts_and_deadlines_are_named() {
        let value = Arc::new(AtomicI64::new(0));
        let seen = value.clone();
        let invariant =
            Invariant::watch(
                "never negative",
                Duration::from_millis(1),
                move || match seen.load(Ordering::SeqCst) {
                    v if v < 0 => Err(format!("it is {v}")),
                    _ => Ok(()),
                },
            );
        value.store(-3, Ordering::SeqCst);
        let violation = wait_until("the violation is seen", Duration::from_secs(5), || async {
            invariant.task.is_finished().then_some(())
        })
        .await;
        assert!(violation.is_ok());
        match invariant.finish().await {
            Err(CheckError::Violated { detail, .. }) => assert_eq!(detail, "it is -3"),
            other => panic!("{other:?}"),
        }
        let late = wait_until("never", Duration::from_millis(30), || async { None::<()> }).await;
        assert_eq!(
            late,
            Err(CheckError::Deadline {
                what: "never".into(),
                after: Duration::from_millis(30)
            })
        );
    }
}
