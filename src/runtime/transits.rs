//! References in flight: a message that carries `ObjectRef`s leaves this
//! process only once their owners have recorded them as in transit.
//!
//! Serializing an `ObjectRef` into a message queues a `Transit` for its
//! owner (`crate::object_store`'s `process/refs.rs`); the receiver's `Hold`
//! consumes it. If the message could leave before the owner had the
//! `Transit`, a sender that died right after (its holds dropped with it)
//! would leave the object with no holder and nothing in transit: freed
//! while the message still refers to it. So:
//!
//! 1. Encoding a message runs inside [`encoding`], which counts the
//!    references serialized into it (the object store calls
//!    [`serialized`] for each).
//! 2. A message with any is written only after [`Transits::delivered`]:
//!    every reference change this process queued so far has been answered
//!    by its owner, or given up on once the owner is known to be gone
//!    (then there is nothing left to free). Messages without references
//!    do not wait.
//!
//! The object store installs the barrier ([`install`]) when it starts; a
//! process without one (no object store yet) has no references to wait
//! for.

use std::cell::Cell;
use std::sync::OnceLock;

use futures::future::BoxFuture;

thread_local! {
    static SERIALIZED: Cell<usize> = const { Cell::new(0) };
}

/// Waits until the reference changes queued so far are delivered.
pub type Barrier = Box<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

static BARRIER: OnceLock<Barrier> = OnceLock::new();

/// Sets this process's barrier (step 2); the first one stays.
pub fn install(barrier: Barrier) {
    let _ = BARRIER.set(barrier);
}

/// A reference is being serialized into a message on this thread (step 1).
pub fn serialized() {
    SERIALIZED.with(|count| count.set(count.get() + 1));
}

/// Runs `encode` and counts the references it serialized into the message.
pub fn encoding<R>(encode: impl FnOnce() -> R) -> (R, Transits) {
    let outer = SERIALIZED.with(|count| count.replace(0));
    let encoded = encode();
    let inner = SERIALIZED.with(|count| count.replace(outer + count.get()));
    (encoded, Transits(inner))
}

/// The references one encoded message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a message with references must wait for `delivered` before it is sent"]
pub struct Transits(usize);

impl Transits {
    /// A message that carries no reference.
    pub const NONE: Transits = Transits(0);

    /// What to wait for before the message is written: `None` when it
    /// carries no reference (or the process tracks none).
    pub fn delivered(self) -> Option<BoxFuture<'static, ()>> {
        match self.0 {
            0 => None,
            _ => BARRIER.get().map(|barrier| barrier()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_references_of_this_encoding_count() {
        let (_, none) = encoding(|| ());
        assert_eq!(none, Transits(0));
        assert!(none.delivered().is_none());
        let ((), outer) = encoding(|| {
            serialized();
            let ((), inner) = encoding(|| {
                serialized();
                serialized();
            });
            assert_eq!(inner, Transits(2));
        });
        assert_eq!(
            outer,
            Transits(3),
            "an enclosing encoding counts what it contains"
        );
    }
}
