//! Panics as death reasons, and the panics a caller catches instead.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;

thread_local! {
    /// Whether a panic on this thread now is caught by [`catch_panic`].
    static CAUGHT: Cell<bool> = const { Cell::new(false) };
}

/// The text of a panic's payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".into())
}

/// Runs `run`, and returns its panic's text if it panics: a panic the
/// caller reports as its own failure (a task's, a block's), not the
/// process's death (a worker's panic hook asks whether the panic is caught
/// here first).
pub fn catch_panic<T>(run: impl FnOnce() -> T) -> Result<T, String> {
    let before = CAUGHT.replace(true);
    let ran = std::panic::catch_unwind(AssertUnwindSafe(run));
    CAUGHT.set(before);
    ran.map_err(|panic| panic_text(&*panic))
}

/// Whether a panic on this thread now is caught by [`catch_panic`].
pub(crate) fn panic_is_caught() -> bool {
    CAUGHT.get()
}
