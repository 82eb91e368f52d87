//! Which incoming connections a node spends a TLS handshake on, and how
//! often it says so. Anyone who can send it UDP packets can start a
//! handshake, token or not; a flood must not take the node's thread, its
//! memory or its log.
//!
//! For each incoming connection, in order:
//!
//! 1. Fewer than [`RETRY_ABOVE`] (16) handshakes in progress: accept.
//! 2. More, and the client's address is not validated: answer with a
//!    stateless QUIC Retry. The client must echo its token from the
//!    address it claims before the node keeps any state or does any
//!    cryptography for it, so floods from spoofed addresses end here.
//! 3. [`MAX_HANDSHAKES`] (64) in progress: refuse at once (a flood from
//!    real addresses); a legitimate peer's dial retries.
//! 4. A handshake is in progress from its acceptance until the nimbus
//!    handshake after TLS is done or failed ([`HandshakeSlot`]).
//! 5. Refusals are logged at most once per [`LOG_INTERVAL`] (10 s), with
//!    the number not logged since the last line.
//!
//! [`Admission`] is the decision, with time passed in; the endpoint's
//! accept loop applies it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Handshakes in progress above which unvalidated clients get a Retry.
pub const RETRY_ABOVE: usize = 16;
/// Handshakes in progress at which new connections are refused.
pub const MAX_HANDSHAKES: usize = 64;
/// At most one refusal line per this interval.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What to do with an incoming connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Take it through the handshake.
    Accept,
    /// Ask it to prove its address first (QUIC Retry).
    Retry,
    /// Refuse it at once.
    Refuse,
}

/// The admission state of one endpoint.
#[derive(Debug, Default)]
pub struct Admission {
    in_progress: usize,
    refusals: LogThrottle,
}

/// At most one log line per [`LOG_INTERVAL`] about something that keeps
/// happening, with the number of times not logged in between (step 5;
/// the bulk listener's closures too, `bulk_sources.rs`).
#[derive(Debug, Default)]
pub struct LogThrottle {
    last_logged: Option<Instant>,
    not_logged: u64,
}

impl LogThrottle {
    /// One more at `now`. `Some(n)`: log it now, saying that `n` since the
    /// last line were not logged; `None`: count it.
    pub fn happened(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last_logged
            .is_none_or(|last| now.duration_since(last) >= LOG_INTERVAL);
        if due {
            self.last_logged = Some(now);
            Some(std::mem::take(&mut self.not_logged))
        } else {
            self.not_logged += 1;
            None
        }
    }
}

impl Admission {
    /// Steps 1–3 for a connection whose address is `validated` (or that
    /// cannot be retried again).
    pub fn decide(&mut self, validated: bool) -> Admit {
        if self.in_progress >= MAX_HANDSHAKES {
            Admit::Refuse
        } else if self.in_progress >= RETRY_ABOVE && !validated {
            Admit::Retry
        } else {
            self.in_progress += 1;
            Admit::Accept
        }
    }

    /// Step 4: an accepted handshake ended (either way).
    pub fn finished(&mut self) {
        self.in_progress = self.in_progress.saturating_sub(1);
    }

    /// Handshakes in progress.
    pub fn in_progress(&self) -> usize {
        self.in_progress
    }

    /// Step 5: a refusal at `now`. `Some(n)`: log it now, saying that `n`
    /// refusals since the last line were not logged; `None`: count it.
    pub fn refusal(&mut self, now: Instant) -> Option<u64> {
        self.refusals.happened(now)
    }
}

/// An accepted handshake's place in the count: it ends when dropped.
#[derive(Debug)]
pub struct HandshakeSlot(Arc<Mutex<Admission>>);

impl HandshakeSlot {
    /// Holds a slot of `admission` (already counted by
    /// [`Admission::decide`]).
    pub fn new(admission: Arc<Mutex<Admission>>) -> Self {
        HandshakeSlot(admission)
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        lock(&self.0).finished();
    }
}

/// The admission state, also after a panic elsewhere poisoned its lock
/// (its counts stay meaningful).
pub fn lock(admission: &Mutex<Admission>) -> std::sync::MutexGuard<'_, Admission> {
    admission
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handshakes_are_accepted_then_retried_then_refused() {
        let mut admission = Admission::default();
        for _ in 0..RETRY_ABOVE {
            assert_eq!(admission.decide(false), Admit::Accept);
        }
        assert_eq!(admission.decide(false), Admit::Retry);
        for _ in RETRY_ABOVE..MAX_HANDSHAKES {
            assert_eq!(admission.decide(true), Admit::Accept);
        }
        assert_eq!(admission.decide(true), Admit::Refuse);
        assert_eq!(admission.decide(false), Admit::Refuse);
        assert_eq!(admission.in_progress(), MAX_HANDSHAKES);
        for _ in 0..MAX_HANDSHAKES - RETRY_ABOVE + 1 {
            admission.finished();
        }
        assert_eq!(admission.decide(false), Admit::Accept);
    }

    #[test]
    fn a_slot_ends_its_handshake_when_dropped() {
        let admission = Arc::new(Mutex::new(Admission::default()));
        assert_eq!(lock(&admission).decide(false), Admit::Accept);
        let slot = HandshakeSlot::new(admission.clone());
        assert_eq!(lock(&admission).in_progress(), 1);
        drop(slot);
        assert_eq!(lock(&admission).in_progress(), 0);
    }

    #[test]
    fn refusals_are_logged_once_per_interval_with_the_count_in_between() {
        let mut admission = Admission::default();
        let start = Instant::now();
        assert_eq!(admission.refusal(start), Some(0));
        for i in 1..=100 {
            assert_eq!(admission.refusal(start + Duration::from_millis(i)), None);
        }
        assert_eq!(admission.refusal(start + LOG_INTERVAL), Some(100));
        assert_eq!(admission.refusal(start + LOG_INTERVAL), None);
    }
}
