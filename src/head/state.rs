//! Libraries' durable records on the head (`crate::cluster`'s
//! [`StateRequest`]): the one head-side table a library needs for state
//! of its own, so that a new library adds no request, actor or store
//! table to nimbus.
//!
//! 1. **Check.** A change is checked by the pure [`StateTable`] against the
//!    limits in `crate::cluster` (`MAX_STATE_KEY`, `MAX_STATE_VALUE`,
//!    `MAX_STATE_RECORDS` per library and job, `MAX_STATE_BYTES` in all:
//!    the table lives in the head's memory); a refused change names the
//!    limit and changes nothing.
//! 2. **Write ahead.** An accepted change is written to the head's store
//!    (`HeadStore::put_record`, `delete_record`) before it is applied and
//!    answered; a failed write is answered with the error and changes
//!    nothing.
//! 3. **Restart.** A restarted head starts from every record its store
//!    holds (`HeadStart::records`).

use std::collections::BTreeMap;

use actix::{Actor, Context, Handler, Message};

use crate::cluster::{
    StateReply, StateRequest, StateScope, MAX_STATE_BYTES, MAX_STATE_KEY, MAX_STATE_RECORDS,
    MAX_STATE_VALUE,
};

use super::store::{HeadStore, StoreError, StoredRecord};

/// Why a change of a library's records was refused.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The library or job name is malformed.
    #[error("{0}")]
    Scope(String),
    /// The key is empty or too long.
    #[error("key of {len} bytes for {library} records of job {job}: 1 to {MAX_STATE_KEY} bytes")]
    Key {
        /// The library.
        library: String,
        /// The job.
        job: String,
        /// Its length.
        len: usize,
    },
    /// The value is too large.
    #[error("value of {len} bytes for key {key:?} of {library}: at most {MAX_STATE_VALUE} bytes (keep large data in the object store and its reference here)")]
    Value {
        /// The library.
        library: String,
        /// The key.
        key: String,
        /// Its length.
        len: usize,
    },
    /// The scope holds as many records as it may.
    #[error(
        "{library} keeps {MAX_STATE_RECORDS} records for job {job} already: delete some first"
    )]
    Full {
        /// The library.
        library: String,
        /// The job.
        job: String,
    },
    /// Every library's records together hold as many bytes as the head
    /// keeps.
    #[error("the head keeps {MAX_STATE_BYTES} bytes of library records already: {library} must delete some of job {job}'s, or other libraries theirs")]
    HeadFull {
        /// The library.
        library: String,
        /// The job.
        job: String,
    },
    /// The head's store could not be written: nothing changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl StateError {
    /// Whether the request itself was at fault (not the head).
    pub fn is_refusal(&self) -> bool {
        !matches!(self, StateError::Store(_))
    }
}

/// The records, by scope and key: the decisions of [`LibraryState`], with
/// no I/O.
#[derive(Debug, Default)]
pub struct StateTable {
    records: BTreeMap<StateScope, BTreeMap<String, Vec<u8>>>,
    /// Bytes of every key and value held.
    bytes: usize,
}

impl StateTable {
    /// The table of a restarted head (step 3).
    pub fn restore(records: Vec<StoredRecord>) -> Self {
        let mut table = StateTable::default();
        for record in records {
            table.apply_put(record.scope, record.key, record.value);
        }
        table
    }

    /// Whether `key` may be set to a value of `len` bytes in `scope`
    /// (step 1).
    pub fn check_put(&self, scope: &StateScope, key: &str, len: usize) -> Result<(), StateError> {
        self.check_key(scope, key)?;
        if len > MAX_STATE_VALUE {
            return Err(StateError::Value {
                library: scope.library.clone(),
                key: key.to_string(),
                len,
            });
        }
        let records = self.records.get(scope);
        let old = records.and_then(|records| records.get(key));
        if old.is_none() && records.map_or(0, BTreeMap::len) >= MAX_STATE_RECORDS {
            return Err(StateError::Full {
                library: scope.library.clone(),
                job: scope.job.clone(),
            });
        }
        let freed = old.map_or(0, |old| key.len() + old.len());
        if self.bytes - freed + key.len() + len > MAX_STATE_BYTES {
            return Err(StateError::HeadFull {
                library: scope.library.clone(),
                job: scope.job.clone(),
            });
        }
        Ok(())
    }

    /// Whether `scope` and `key` can name a record.
    pub fn check_key(&self, scope: &StateScope, key: &str) -> Result<(), StateError> {
        scope.check().map_err(StateError::Scope)?;
        if key.is_empty() || key.len() > MAX_STATE_KEY {
            return Err(StateError::Key {
                library: scope.library.clone(),
                job: scope.job.clone(),
                len: key.len(),
            });
        }
        Ok(())
    }

    /// Sets `key` in `scope`, once checked and written.
    pub fn apply_put(&mut self, scope: StateScope, key: String, value: Vec<u8>) {
        let added = key.len() + value.len();
        let records = self.records.entry(scope).or_default();
        if let Some(old) = records.get(&key) {
            self.bytes -= key.len() + old.len();
        }
        records.insert(key, value);
        self.bytes += added;
    }

    /// Deletes `key` in `scope`, once written; whether it had a value.
    pub fn apply_delete(&mut self, scope: &StateScope, key: &str) -> bool {
        let Some(records) = self.records.get_mut(scope) else {
            return false;
        };
        let removed = records.remove(key);
        if let Some(old) = &removed {
            self.bytes -= key.len() + old.len();
        }
        let had = removed.is_some();
        if records.is_empty() {
            self.records.remove(scope);
        }
        had
    }

    /// Whether `scope` has `key`.
    pub fn contains(&self, scope: &StateScope, key: &str) -> bool {
        self.records
            .get(scope)
            .is_some_and(|records| records.contains_key(key))
    }

    /// The value of `key` in `scope`.
    pub fn get(&self, scope: &StateScope, key: &str) -> Option<&[u8]> {
        self.records.get(scope)?.get(key).map(Vec::as_slice)
    }

    /// The keys of `scope` that start with `prefix`, in order (at most
    /// `MAX_STATE_RECORDS`, as many as a scope holds).
    pub fn keys(&self, scope: &StateScope, prefix: &str) -> Vec<String> {
        let Some(records) = self.records.get(scope) else {
            return Vec::new();
        };
        records
            .range(prefix.to_string()..)
            .map(|(key, _)| key)
            .take_while(|key| key.starts_with(prefix))
            .cloned()
            .collect()
    }
}

/// The head's keeper of libraries' records: a thin shell around
/// [`StateTable`] and the head's store.
pub struct LibraryState {
    table: StateTable,
    /// Where the records go (none in tests that need no restart).
    store: Option<HeadStore>,
}

impl LibraryState {
    /// A keeper writing to `store`, starting from `records` (step 3).
    pub fn new(store: Option<HeadStore>, records: Vec<StoredRecord>) -> Self {
        LibraryState {
            table: StateTable::restore(records),
            store,
        }
    }
}

impl Actor for LibraryState {
    type Context = Context<Self>;
}

impl Message for StateRequest {
    type Result = Result<StateReply, StateError>;
}

impl Handler<StateRequest> for LibraryState {
    type Result = Result<StateReply, StateError>;

    fn handle(&mut self, request: StateRequest, _: &mut Context<Self>) -> Self::Result {
        match request {
            StateRequest::Put { scope, key, value } => {
                self.table.check_put(&scope, &key, value.len())?;
                let record = StoredRecord { scope, key, value };
                if let Some(store) = &self.store {
                    store.put_record(&record)?;
                }
                self.table.apply_put(record.scope, record.key, record.value);
                Ok(StateReply::Ack)
            }
            StateRequest::Get { scope, key } => {
                self.table.check_key(&scope, &key)?;
                let value = self.table.get(&scope, &key).map(|v| v.to_vec().into());
                Ok(StateReply::Value(value))
            }
            StateRequest::List { scope, prefix } => {
                scope.check().map_err(StateError::Scope)?;
                Ok(StateReply::Keys(self.table.keys(&scope, &prefix)))
            }
            StateRequest::Delete { scope, key } => {
                self.table.check_key(&scope, &key)?;
                if !self.table.contains(&scope, &key) {
                    return Ok(StateReply::Deleted(false));
                }
                if let Some(store) = &self.store {
                    store.delete_record(&scope, &key)?;
                }
                Ok(StateReply::Deleted(self.table.apply_delete(&scope, &key)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(library: &str, job: &str) -> StateScope {
        StateScope {
            library: library.into(),
            job: job.into(),
        }
    }

    #[test]
    fn keys_are_listed_in_order_by_prefix_within_their_scope_only() {
        let mut table = StateTable::default();
        for key in ["deploy/b", "deploy/a", "route/x", "deployment"] {
            table.apply_put(scope("serve", "j1"), key.into(), key.as_bytes().to_vec());
        }
        table.apply_put(scope("serve", "j2"), "deploy/c".into(), Vec::new());
        table.apply_put(scope("data", "j1"), "deploy/d".into(), Vec::new());
        let keys = table.keys(&scope("serve", "j1"), "deploy/");
        assert_eq!(keys, ["deploy/a", "deploy/b"]);
        assert_eq!(table.keys(&scope("serve", "j1"), "").len(), 4);
        assert_eq!(
            table.get(&scope("serve", "j1"), "route/x"),
            Some(&b"route/x"[..])
        );
        assert_eq!(table.get(&scope("serve", "j3"), "route/x"), None);
    }

    #[test]
    fn a_change_past_a_limit_is_refused_naming_it_and_changes_nothing() {
        let mut table = StateTable::default();
        let s = scope("serve", "j1");
        let big = table.check_put(&s, "k", MAX_STATE_VALUE + 1).unwrap_err();
        assert!(big.to_string().contains("at most 1048576 bytes"), "{big}");
        let long = "k".repeat(MAX_STATE_KEY + 1);
        assert!(matches!(
            table.check_put(&s, &long, 1),
            Err(StateError::Key { .. })
        ));
        assert!(matches!(
            table.check_put(&s, "", 1),
            Err(StateError::Key { .. })
        ));
        let bad = table.check_put(&scope("ser/ve", "j1"), "k", 1).unwrap_err();
        assert!(bad.to_string().contains("library name"), "{bad}");
        for i in 0..MAX_STATE_RECORDS {
            table.apply_put(s.clone(), format!("k{i}"), Vec::new());
        }
        let full = table.check_put(&s, "one-more", 1).unwrap_err();
        assert!(matches!(full, StateError::Full { .. }), "{full}");
        // Overwriting a key a full scope has is fine, as is another scope.
        table.check_put(&s, "k7", 10).unwrap();
        table
            .check_put(&scope("serve", "j2"), "one-more", 1)
            .unwrap();
        assert!(table.apply_delete(&s, "k7"));
        assert!(!table.apply_delete(&s, "k7"));
        table.check_put(&s, "one-more", 1).unwrap();
    }

    #[test]
    fn every_librarys_records_together_are_bounded_in_bytes() {
        let mut table = StateTable::default();
        let value = vec![0u8; MAX_STATE_VALUE];
        // Many libraries of one job: no scope is full, the head is.
        let mut library = 0;
        while table
            .check_put(&scope(&format!("lib{library}"), "j1"), "k", value.len())
            .is_ok()
        {
            table.apply_put(
                scope(&format!("lib{library}"), "j1"),
                "k".into(),
                value.clone(),
            );
            library += 1;
        }
        assert_eq!(library, MAX_STATE_BYTES / (MAX_STATE_VALUE + 1));
        let full = table
            .check_put(&scope("other", "j2"), "k", value.len())
            .unwrap_err();
        assert!(matches!(full, StateError::HeadFull { .. }), "{full}");
        // Replacing a value with one as large fits; deleting makes room.
        table
            .check_put(&scope("lib0", "j1"), "k", value.len())
            .unwrap();
        assert!(table.apply_delete(&scope("lib0", "j1"), "k"));
        table
            .check_put(&scope("other", "j2"), "k", value.len())
            .unwrap();
    }

    #[test]
    fn a_restored_table_holds_what_was_stored() {
        let records = vec![
            StoredRecord {
                scope: scope("serve", "j1"),
                key: "a".into(),
                value: vec![1],
            },
            StoredRecord {
                scope: scope("serve", "j1"),
                key: "b".into(),
                value: vec![2],
            },
        ];
        let table = StateTable::restore(records);
        assert_eq!(table.get(&scope("serve", "j1"), "b"), Some(&[2u8][..]));
        assert_eq!(table.keys(&scope("serve", "j1"), ""), ["a", "b"]);
    }
}
