//! Per-process state of the features above the runtime (the task pool,
//! the task reports), kept in this process's [`ProcessContext`] rather
//! than in statics of their own: one value of each type, made on first
//! use, living as long as the context.
//!
//! [`ProcessContext`]: super::ProcessContext

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One value per type.
#[derive(Default)]
pub(super) struct Extensions(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl Extensions {
    /// The `T`, made with `T::default()` on first use.
    pub(super) fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let value = values
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(value).downcast::<T>() {
            Ok(value) => value,
            // Keyed by its own type id: a value of another type is never
            // found here, but if it were it would be replaced, not used.
            Err(_) => {
                let fresh = Arc::new(T::default());
                *value = fresh.clone();
                fresh
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counter(AtomicUsize);

    #[derive(Default)]
    struct Other(AtomicUsize);

    #[test]
    fn each_type_has_one_value_per_set_of_extensions() {
        let first = Extensions::default();
        first.get::<Counter>().0.fetch_add(2, Ordering::Relaxed);
        first.get::<Counter>().0.fetch_add(3, Ordering::Relaxed);
        first.get::<Other>().0.fetch_add(7, Ordering::Relaxed);
        assert_eq!(first.get::<Counter>().0.load(Ordering::Relaxed), 5);
        assert_eq!(first.get::<Other>().0.load(Ordering::Relaxed), 7);
        // Another context's are its own.
        let second = Extensions::default();
        assert_eq!(second.get::<Counter>().0.load(Ordering::Relaxed), 0);
    }
}
