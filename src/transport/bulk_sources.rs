//! Which TCP connections a bulk listener (`bulk.rs`, step 4) spends a
//! TLS handshake on. Anyone who can reach its port can start one, token
//! or not, and each costs the listener a signature: a flood from one
//! address must neither take the handshakes every other peer needs nor
//! unbounded CPU. (The listener runs on a thread of its own, so what it
//! does spend never delays the node's heartbeats.)
//!
//! For each TCP connection accepted from source address `A` at `now`:
//!
//! 1. `A` has [`PER_SOURCE`] (32, half the listener's handshakes)
//!    handshakes in progress: close it unread.
//! 2. `A` began [`PER_SOURCE_PER_SECOND`] (512) handshakes in the second
//!    that began with its first one of that second: close it unread.
//! 3. Otherwise its handshake counts against `A` until it ends, either way
//!    ([`SourceLimits::finished`]).
//! 4. Closures are logged at most once per
//!    [`LOG_INTERVAL`](super::admission::LOG_INTERVAL) (10 s), with the
//!    number not logged since the last line (`admission.rs`'s
//!    [`LogThrottle`]).
//!
//! A source with no handshake in progress whose second is over is
//! forgotten, so the table holds at most the sources of the last second.
//! [`SourceLimits`] is the decision, with time passed in.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::admission::LogThrottle;
#[cfg(test)]
use super::admission::LOG_INTERVAL;

/// Handshakes one source address may have in progress at once.
pub const PER_SOURCE: usize = 32;
/// Handshakes one source address may begin per second.
pub const PER_SOURCE_PER_SECOND: u32 = 512;
/// The window of [`PER_SOURCE_PER_SECOND`].
const WINDOW: Duration = Duration::from_secs(1);

/// Why a connection was closed unread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closed {
    /// Step 1: too many handshakes in progress from its address.
    InProgress,
    /// Step 2: too many handshakes begun from its address this second.
    Rate,
}

/// One source address's handshakes.
#[derive(Debug)]
struct Source {
    in_progress: usize,
    window_start: Instant,
    begun: u32,
}

/// The per-source state of one bulk listener.
#[derive(Debug, Default)]
pub(super) struct SourceLimits {
    sources: HashMap<IpAddr, Source>,
    closures: LogThrottle,
}

impl SourceLimits {
    /// Steps 1–3 for a connection from `source` at `now`: `Ok` counts its
    /// handshake (end it with [`finished`](Self::finished)).
    pub(super) fn admit(&mut self, source: IpAddr, now: Instant) -> Result<(), Closed> {
        self.forget_idle(now);
        let entry = self.sources.entry(source).or_insert(Source {
            in_progress: 0,
            window_start: now,
            begun: 0,
        });
        if now.duration_since(entry.window_start) >= WINDOW {
            entry.window_start = now;
            entry.begun = 0;
        }
        if entry.in_progress >= PER_SOURCE {
            return Err(Closed::InProgress);
        }
        if entry.begun >= PER_SOURCE_PER_SECOND {
            return Err(Closed::Rate);
        }
        entry.in_progress += 1;
        entry.begun += 1;
        Ok(())
    }

    /// Step 3: a handshake from `source` that [`admit`](Self::admit)
    /// counted ended.
    pub(super) fn finished(&mut self, source: IpAddr) {
        if let Some(entry) = self.sources.get_mut(&source) {
            entry.in_progress = entry.in_progress.saturating_sub(1);
        }
    }

    /// Step 4: a closure at `now`. `Some(n)`: log it now, saying that `n`
    /// closures since the last line were not logged; `None`: count it.
    pub(super) fn closure(&mut self, now: Instant) -> Option<u64> {
        self.closures.happened(now)
    }

    /// Sources tracked.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.sources.len()
    }

    fn forget_idle(&mut self, now: Instant) {
        self.sources.retain(|_, source| {
            source.in_progress > 0 || now.duration_since(source.window_start) < WINDOW
        });
    }
}

/// A connection's handshake, counted against its source address until
/// dropped (step 3).
#[derive(Debug)]
pub(super) struct SourceSlot {
    limits: Arc<Mutex<SourceLimits>>,
    source: IpAddr,
}

impl SourceSlot {
    /// Steps 1–4 for a connection from `source` at `now`: its slot, or
    /// `None` (the caller closes it unread; the closure is logged as step
    /// 4 says).
    pub(super) fn admit(
        limits: &Arc<Mutex<SourceLimits>>,
        source: IpAddr,
        now: Instant,
    ) -> Option<Self> {
        let mut state = lock(limits);
        match state.admit(source, now) {
            Ok(()) => Some(SourceSlot {
                limits: limits.clone(),
                source,
            }),
            Err(why) => {
                if let Some(not_logged) = state.closure(now) {
                    tracing::warn!(
                        %source,
                        "bulk listener: closed a connection unread ({why:?}: more than {PER_SOURCE} handshakes at once or {PER_SOURCE_PER_SECOND} a second from one address); {not_logged} more since the last such line"
                    );
                }
                None
            }
        }
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        lock(&self.limits).finished(self.source);
    }
}

/// The limits, also after a panic elsewhere poisoned their lock.
fn lock(limits: &Mutex<SourceLimits>) -> MutexGuard<'_, SourceLimits> {
    limits.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_source_holds_at_most_its_share_of_handshakes() {
        let mut limits = SourceLimits::default();
        let now = Instant::now();
        for _ in 0..PER_SOURCE {
            assert_eq!(limits.admit(ip(2), now), Ok(()));
        }
        assert_eq!(limits.admit(ip(2), now), Err(Closed::InProgress));
        // Another source is not held back by the first.
        assert_eq!(limits.admit(ip(1), now), Ok(()));
        limits.finished(ip(2));
        assert_eq!(limits.admit(ip(2), now), Ok(()));
    }

    #[test]
    fn one_source_begins_at_most_its_rate_per_second() {
        let mut limits = SourceLimits::default();
        let start = Instant::now();
        for i in 0..PER_SOURCE_PER_SECOND {
            let now = start + Duration::from_micros(u64::from(i));
            assert_eq!(limits.admit(ip(2), now), Ok(()));
            limits.finished(ip(2));
        }
        let later = start + Duration::from_millis(999);
        assert_eq!(limits.admit(ip(2), later), Err(Closed::Rate));
        assert_eq!(limits.admit(ip(1), later), Ok(()));
        assert_eq!(limits.admit(ip(2), start + WINDOW), Ok(()));
    }

    #[test]
    fn idle_sources_are_forgotten() {
        let mut limits = SourceLimits::default();
        let start = Instant::now();
        for last in 1..=200 {
            assert_eq!(limits.admit(ip(last), start), Ok(()));
            limits.finished(ip(last));
        }
        assert_eq!(limits.admit(ip(250), start), Ok(()));
        assert_eq!(limits.tracked(), 201);
        // A second later only the source still handshaking is kept.
        assert_eq!(limits.admit(ip(251), start + WINDOW), Ok(()));
        assert_eq!(limits.tracked(), 2);
    }

    #[test]
    fn a_slot_counts_until_dropped() {
        let limits = Arc::new(Mutex::new(SourceLimits::default()));
        let now = Instant::now();
        let slots: Vec<_> = (0..PER_SOURCE)
            .map(|_| SourceSlot::admit(&limits, ip(2), now).unwrap())
            .collect();
        assert!(SourceSlot::admit(&limits, ip(2), now).is_none());
        drop(slots);
        assert!(SourceSlot::admit(&limits, ip(2), now).is_some());
    }

    #[test]
    fn closures_are_logged_once_per_interval_with_the_count_in_between() {
        let mut limits = SourceLimits::default();
        let start = Instant::now();
        assert_eq!(limits.closure(start), Some(0));
        for i in 1..=50 {
            assert_eq!(limits.closure(start + Duration::from_millis(i)), None);
        }
        assert_eq!(limits.closure(start + LOG_INTERVAL), Some(50));
    }
}
