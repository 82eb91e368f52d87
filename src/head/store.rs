//! The head's durable state: what it knows that its members cannot tell
//! it again, in one crash-safe file, `$NIMBUS_HOME/head.redb` (redb:
//! embedded, ACID, one file, no server to install).
//!
//! 1. **Open.** `nimbus start --head` opens the store before anything else
//!    ([`HeadStore::open`]): one head per store (a second gets
//!    [`StoreError::InUse`]); every record is read and decoded at once, so
//!    a store that does not open or does not decode stops the start
//!    ([`StoreError::Unreadable`], [`StoreError::Corrupt`]) naming the
//!    file and the choices. It never starts empty over a cluster that
//!    may still run.
//! 2. **Credentials.** A new store takes the head's token and a new ticket
//!    key; a store that has them gives them back ([`Loaded`]), so a
//!    restarted head has the same token and CA (members and drivers still
//!    authenticate) and the same ticket key (members' tickets stay valid).
//! 3. **Epoch.** Every start bumps the epoch ([`HeadStore::next_epoch`]);
//!    the event stream numbers this start's events above every earlier
//!    start's (`head/events.rs`), so a reader that kept its place from
//!    before a restart does not skip the new events.
//! 4. **Write-ahead.** Membership writes a node's record (registration,
//!    and its death once declared) before it answers the request that
//!    changed it ([`HeadStore::put_node`]), and the directory an actor's
//!    record (with its spec while it lives) before it answers the report
//!    that changed it ([`HeadStore::put_actor`]), and the job keeper a
//!    job's record when it is created or changes state
//!    ([`HeadStore::put_jobs`]): a join, spawn or submission the head
//!    acknowledged survives a crash right after it. One transaction per
//!    change; each commit is durable (fsync) when it returns (0.3–0.5 ms
//!    on this project's machine).
//! 5. **Not stored.** What the members can tell again when they come back
//!    (resources in use, liveness, the objects they hold) is re-learnt
//!    from them, not stored.
//!
//! Libraries' records (`head/state.rs`) are written the same way, before
//! a change is acknowledged.
//!
//! Placement groups need nothing here: the nodes hold their bundles and
//! the creator the group (`crate::placement`). Not stored: the training
//! runs' reports (`head/runs.rs`) and the task table (`head/tasks.rs`);
//! a restarted head shows a run from its next report on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::cluster::{ActorId, ActorRecord, ActorSpec, JobRecord, NodeRegistration, StateScope};
use crate::transport::Rotation;
use crate::transport::{JoinToken, ResetKey};
use crate::wire::NodeIdentity;

/// The store's file name under `$NIMBUS_HOME`.
pub const FILE: &str = "head.redb";

/// The version of what this code writes; a store of another is refused.
const FORMAT: u64 = 1;

/// The cluster's own records: `format`, `token`, `ticket_key`,
/// `ticket_rotation` (MessagePack of a [`Rotation`], while one is under
/// way or since the last), `reset_key`, `epoch`.
const CLUSTER: TableDefinition<&str, &[u8]> = TableDefinition::new("cluster");
/// Node records by node name (MessagePack of [`StoredNode`]).
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");
/// The actor directory by actor id (MessagePack of [`StoredActor`]).
const ACTORS: TableDefinition<u64, &[u8]> = TableDefinition::new("actors");
/// Jobs by job id (MessagePack of [`StoredJob`]).
const JOBS: TableDefinition<&str, &[u8]> = TableDefinition::new("jobs");
/// Libraries' records by `LIBRARY/JOB/KEY` (MessagePack of
/// [`StoredRecord`]; library and job names hold no `/`).
const RECORDS: TableDefinition<&str, &[u8]> = TableDefinition::new("library_records");

/// One node as the head keeps it across restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredNode {
    /// What it said when it joined (its name, incarnation, address,
    /// resources, versions).
    pub registration: NodeRegistration,
    /// Whether it was the head.
    pub head: bool,
    /// Why it was declared dead, if it was.
    pub death_reason: Option<String>,
}

/// One library record (`head/state.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredRecord {
    /// Its library and job.
    pub scope: StateScope,
    /// Its key.
    pub key: String,
    /// Its value.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

impl StoredRecord {
    fn table_key(scope: &StateScope, key: &str) -> String {
        format!("{}/{}/{key}", scope.library, scope.job)
    }
}

/// One actor as the head's directory keeps it across restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredActor {
    /// Where it runs (ran), which incarnation, its restarts, whether it
    /// is dead or restarting.
    pub record: ActorRecord,
    /// What it was started from, while it lives (for restarts elsewhere).
    pub spec: Option<ActorSpec>,
}

/// One job as the head's job keeper keeps it across restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredJob {
    /// What `nimbus job list` shows of it.
    pub record: JobRecord,
    /// A stop was asked for (its driver's exit ends it `STOPPED`).
    pub stopping: bool,
}

/// A cluster's credentials as its store keeps them.
pub struct Credentials {
    /// The join token.
    pub token: JoinToken,
    /// The ticket key (PKCS#8).
    pub ticket_key: Vec<u8>,
    /// The ticket key's last rotation (`crate::transport`'s
    /// `ticket_keys.rs`), if any.
    pub ticket_rotation: Option<Rotation>,
    /// The head endpoint's stateless-reset key.
    pub reset_key: ResetKey,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

/// What an opened store held.
#[derive(Debug)]
pub struct Loaded {
    /// The cluster's credentials; `None` in a new store.
    pub cluster: Option<Credentials>,
    /// Every node the head had heard of.
    pub nodes: Vec<StoredNode>,
    /// Every actor in the directory, live or dead.
    pub actors: Vec<StoredActor>,
    /// Every job the head kept, live or ended.
    pub jobs: Vec<StoredJob>,
    /// Every library record.
    pub records: Vec<StoredRecord>,
}

impl Loaded {
    /// Whether this is a head's restart (the store held a cluster).
    pub fn restarted(&self) -> bool {
        self.cluster.is_some()
    }
}

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process has it open.
    #[error("the head's store {path} is already in use by another process: a head runs with this NIMBUS_HOME already; stop it, or start this head with another NIMBUS_HOME")]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// It could not be created, or made readable by its owner only.
    #[error("cannot create the head's store {path} readable by its owner only (0600): {source}")]
    Private {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// redb cannot open or read it.
    #[error("the head's store {path} cannot be read ({source}); restore it from a copy, or move it aside to start a new cluster (its members must then be restarted against the new head)")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What redb said.
        source: redb::Error,
    },
    /// It opens, but a record does not decode.
    #[error("the head's store {path} holds a {record} record that does not decode ({detail}); restore it from a copy, or move it aside to start a new cluster (its members must then be restarted against the new head)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which record.
        record: String,
        /// Why it does not decode.
        detail: String,
    },
    /// A change could not be made durable.
    #[error("cannot write the head's store {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What redb said.
        source: redb::Error,
    },
    /// No ticket key could be made for a new cluster.
    #[error("cannot make the head's ticket key: {0}")]
    Key(#[from] crate::transport::CredentialError),
    /// The head was given a token other than the one its store holds.
    #[error("the head's store {path} belongs to a cluster with another token than the one given (--token-file or $NIMBUS_HEAD_TOKEN); give that cluster's token, or start this head with another NIMBUS_HOME")]
    OtherToken {
        /// The file.
        path: PathBuf,
    },
}

/// A head's store opened for its start ([`HeadStore::start`]): what the
/// head process needs of it.
#[derive(Clone)]
pub struct HeadStart {
    /// The store, for the changes to come.
    pub store: HeadStore,
    /// The ticket key (PKCS#8): the store's, or a new one.
    pub ticket_key: Vec<u8>,
    /// Its last rotation, if any.
    pub ticket_rotation: Option<Rotation>,
    /// The head endpoint's stateless-reset key (step 2).
    pub reset_key: ResetKey,
    /// The nodes the previous heads knew (none for a new cluster).
    pub nodes: Vec<StoredNode>,
    /// The actors the previous heads knew (none for a new cluster).
    pub actors: Vec<StoredActor>,
    /// The jobs the previous heads kept (none for a new cluster).
    pub jobs: Vec<StoredJob>,
    /// Libraries' records (none for a new cluster).
    pub records: Vec<StoredRecord>,
    /// Whether the store held a cluster (this start is a restart).
    pub restarted: bool,
}

impl HeadStart {
    /// The nodes whose actors a restarted head must treat as lost, with
    /// why: every previous head (its workers died with it; recorded dead
    /// now, so a later head does not take it for its predecessor again)
    /// and every node the store records dead (a head may have died between
    /// recording a death and handling its actors).
    pub fn lost_nodes(&self) -> Result<Vec<(NodeIdentity, String)>, StoreError> {
        let mut lost = Vec::new();
        for node in &self.nodes {
            let identity = node.registration.node.clone();
            match (&node.death_reason, node.head) {
                (Some(reason), _) => lost.push((identity, reason.clone())),
                (None, true) => {
                    let reason = "the head restarted; its workers died with it".to_string();
                    let dead = StoredNode {
                        death_reason: Some(reason.clone()),
                        ..node.clone()
                    };
                    self.store.put_node(&dead)?;
                    lost.push((identity, reason));
                }
                (None, false) => {}
            }
        }
        Ok(lost)
    }
}

impl std::fmt::Debug for HeadStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadStart")
            .field("store", &self.store)
            .field("nodes", &self.nodes.len())
            .field("actors", &self.actors.len())
            .field("jobs", &self.jobs.len())
            .field("restarted", &self.restarted)
            .finish_non_exhaustive()
    }
}

/// The head's store; cheap to clone (one open database).
#[derive(Clone)]
pub struct HeadStore {
    db: Arc<Database>,
    path: PathBuf,
}

impl std::fmt::Debug for HeadStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadStore")
            .field("path", &self.path)
            .finish()
    }
}

impl HeadStore {
    /// Opens (or creates) the store in `dir` and reads all of it (step 1).
    pub fn open(dir: &Path) -> Result<(HeadStore, Loaded), StoreError> {
        let path = dir.join(FILE);
        // It holds the token and the keys: 0600 before redb opens it (redb
        // would create it at the umask's mode).
        crate::host::files::private_existing(&path).map_err(|source| StoreError::Private {
            path: path.clone(),
            source,
        })?;
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::InUse { path: path.clone() },
            other => StoreError::Unreadable {
                path: path.clone(),
                source: other.into(),
            },
        })?;
        let store = HeadStore {
            db: Arc::new(db),
            path,
        };
        let loaded = store.load()?;
        Ok((store, loaded))
    }

    /// Opens the store in `dir` for a head's start (steps 1–2) and returns
    /// the cluster's token with it: the store's when it holds a cluster
    /// (`given`, if any, must be the same), else `given` or a new one,
    /// recorded with new keys.
    pub fn start(
        dir: &Path,
        given: Option<JoinToken>,
    ) -> Result<(JoinToken, HeadStart), StoreError> {
        let (store, loaded) = HeadStore::open(dir)?;
        if let Some(cluster) = loaded.cluster {
            if given.as_ref().is_some_and(|given| *given != cluster.token) {
                return Err(StoreError::OtherToken { path: store.path });
            }
            let start = HeadStart {
                store,
                ticket_key: cluster.ticket_key,
                ticket_rotation: cluster.ticket_rotation,
                reset_key: cluster.reset_key,
                nodes: loaded.nodes,
                actors: loaded.actors,
                jobs: loaded.jobs,
                records: loaded.records,
                restarted: true,
            };
            return Ok((cluster.token, start));
        }
        let mut reset_key = [0u8; 32];
        rand::fill(&mut reset_key);
        let cluster = Credentials {
            token: given.unwrap_or_else(JoinToken::generate),
            ticket_key: crate::transport::generate_pkcs8()?,
            ticket_rotation: None,
            reset_key: ResetKey(reset_key),
        };
        store.init(&cluster)?;
        let start = HeadStart {
            store,
            ticket_key: cluster.ticket_key,
            ticket_rotation: None,
            reset_key: cluster.reset_key,
            nodes: Vec::new(),
            actors: Vec::new(),
            jobs: Vec::new(),
            records: Vec::new(),
            restarted: false,
        };
        Ok((cluster.token, start))
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records the credentials of a new cluster (step 2), in one
    /// transaction: a store holds all of them or none (a head that died
    /// during its first start leaves a store that reads as new).
    pub fn init(&self, cluster: &Credentials) -> Result<(), StoreError> {
        self.write(|tx| {
            let mut table = tx.open_table(CLUSTER)?;
            table.insert("format", FORMAT.to_le_bytes().as_slice())?;
            table.insert("token", cluster.token.to_string().as_bytes())?;
            table.insert("ticket_key", cluster.ticket_key.as_slice())?;
            table.insert("reset_key", cluster.reset_key.0.as_slice())?;
            Ok(())
        })
    }

    /// Records a rotation of the ticket key: the key that signed before it
    /// (`current`, PKCS#8) and the rotation, in one transaction.
    pub fn save_ticket_keys(&self, current: &[u8], rotation: &Rotation) -> Result<(), StoreError> {
        let rotation = rmp_serde::to_vec_named(rotation).unwrap_or_default();
        self.write(|tx| {
            let mut table = tx.open_table(CLUSTER)?;
            table.insert("ticket_key", current)?;
            table.insert("ticket_rotation", rotation.as_slice())?;
            Ok(())
        })
    }

    /// Bumps and returns the epoch: 1 at a cluster's first start (step 3).
    pub fn next_epoch(&self) -> Result<u64, StoreError> {
        let mut epoch = 0;
        self.write(|tx| {
            let mut cluster = tx.open_table(CLUSTER)?;
            let before = cluster
                .get("epoch")?
                .and_then(|value| <[u8; 8]>::try_from(value.value()).ok())
                .map_or(0, u64::from_le_bytes);
            epoch = before + 1;
            cluster.insert("epoch", epoch.to_le_bytes().as_slice())?;
            Ok(())
        })?;
        Ok(epoch)
    }

    /// Writes `node`'s record, durably, before the change is acknowledged
    /// (step 4).
    pub fn put_node(&self, node: &StoredNode) -> Result<(), StoreError> {
        let bytes = rmp_serde::to_vec_named(node).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            record: format!("node {}", node.registration.node),
            detail: e.to_string(),
        })?;
        self.write(|tx| {
            let mut nodes = tx.open_table(NODES)?;
            nodes.insert(node.registration.node.name.as_str(), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Writes `actor`'s directory record and forgets the dead actors in
    /// `forgotten` (the directory keeps a bounded number), in one
    /// transaction, durably, before the change is acknowledged (step 4).
    pub fn put_actor(&self, actor: &StoredActor, forgotten: &[ActorId]) -> Result<(), StoreError> {
        let id = actor.record.actor;
        let bytes = rmp_serde::to_vec_named(actor).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            record: format!("actor {id}"),
            detail: e.to_string(),
        })?;
        self.write(|tx| {
            let mut actors = tx.open_table(ACTORS)?;
            for gone in forgotten {
                actors.remove(gone.0)?;
            }
            actors.insert(id.0, bytes.as_slice())?;
            Ok(())
        })
    }

    /// Forgets the dead actors in `forgotten` (a restarted head's
    /// directory keeps a bounded number of the ones it loaded).
    pub fn forget_actors(&self, forgotten: &[ActorId]) -> Result<(), StoreError> {
        if forgotten.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut actors = tx.open_table(ACTORS)?;
            for gone in forgotten {
                actors.remove(gone.0)?;
            }
            Ok(())
        })
    }

    /// Writes the records of the jobs that changed and forgets those the
    /// keeper dropped, in one transaction, before the changes are
    /// acknowledged (step 4).
    pub fn put_jobs(&self, changed: &[StoredJob], forgotten: &[String]) -> Result<(), StoreError> {
        let mut encoded = Vec::with_capacity(changed.len());
        for job in changed {
            let bytes = rmp_serde::to_vec_named(job).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                record: format!("job {}", job.record.id),
                detail: e.to_string(),
            })?;
            encoded.push((job.record.id.as_str(), bytes));
        }
        self.write(|tx| {
            let mut jobs = tx.open_table(JOBS)?;
            // Forgotten first: an id forgotten and then taken again in
            // one batch keeps its new record.
            for id in forgotten {
                jobs.remove(id.as_str())?;
            }
            for (id, bytes) in &encoded {
                jobs.insert(*id, bytes.as_slice())?;
            }
            Ok(())
        })
    }

    /// Writes a library record before its change is acknowledged
    /// (`head/state.rs`, step 2).
    pub fn put_record(&self, record: &StoredRecord) -> Result<(), StoreError> {
        let key = StoredRecord::table_key(&record.scope, &record.key);
        let bytes = rmp_serde::to_vec_named(record).map_err(|e| StoreError::Corrupt {
            path: self.path.clone(),
            record: format!("library record {key:?}"),
            detail: e.to_string(),
        })?;
        self.write(|tx| {
            tx.open_table(RECORDS)?
                .insert(key.as_str(), bytes.as_slice())?;
            Ok(())
        })
    }

    /// Deletes a library record before its deletion is acknowledged.
    pub fn delete_record(&self, scope: &StateScope, key: &str) -> Result<(), StoreError> {
        let key = StoredRecord::table_key(scope, key);
        self.write(|tx| {
            tx.open_table(RECORDS)?.remove(key.as_str())?;
            Ok(())
        })
    }

    fn write(
        &self,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), StoreError> {
        let failed = |source: redb::Error| StoreError::Write {
            path: self.path.clone(),
            source,
        };
        let tx = self.db.begin_write().map_err(|e| failed(e.into()))?;
        change(&tx).map_err(failed)?;
        tx.commit().map_err(|e| failed(e.into()))
    }

    /// Reads and decodes the whole store.
    pub(crate) fn load(&self) -> Result<Loaded, StoreError> {
        let unreadable = |source: redb::Error| StoreError::Unreadable {
            path: self.path.clone(),
            source,
        };
        let corrupt = |record: &str, detail: String| StoreError::Corrupt {
            path: self.path.clone(),
            record: record.to_string(),
            detail,
        };
        let tx = self.db.begin_read().map_err(|e| unreadable(e.into()))?;
        let mut loaded = Loaded {
            cluster: None,
            nodes: Vec::new(),
            actors: Vec::new(),
            jobs: Vec::new(),
            records: Vec::new(),
        };
        let cluster = match tx.open_table(CLUSTER) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(loaded),
            Err(e) => return Err(unreadable(e.into())),
        };
        let get = |key: &str| -> Result<Option<Vec<u8>>, StoreError> {
            let value = cluster.get(key).map_err(|e| unreadable(e.into()))?;
            Ok(value.map(|v| v.value().to_vec()))
        };
        // Written in one transaction with the rest (`init`): without it the
        // store holds no cluster yet.
        let Some(token) = get("token")? else {
            return Ok(loaded);
        };
        let format = get("format")?
            .and_then(|bytes| <[u8; 8]>::try_from(bytes.as_slice()).ok())
            .map(u64::from_le_bytes);
        if format != Some(FORMAT) {
            let detail = format!("format {format:?}, this nimbus reads format {FORMAT}");
            return Err(corrupt("format", detail));
        }
        let token = String::from_utf8(token).map_err(|e| corrupt("token", e.to_string()))?;
        let token = token
            .parse()
            .map_err(|e: crate::transport::CredentialError| corrupt("token", e.to_string()))?;
        let ticket_key =
            get("ticket_key")?.ok_or_else(|| corrupt("ticket key", "missing".into()))?;
        crate::transport::TicketAuthority::from_pkcs8(&ticket_key)
            .map_err(|e| corrupt("ticket key", e.to_string()))?;
        let reset_key = get("reset_key")?
            .and_then(|bytes| <[u8; 32]>::try_from(bytes.as_slice()).ok())
            .ok_or_else(|| corrupt("reset key", "missing or not 32 bytes".into()))?;
        let ticket_rotation = match get("ticket_rotation")? {
            Some(bytes) => Some(
                rmp_serde::from_slice::<Rotation>(&bytes)
                    .map_err(|e| corrupt("ticket rotation", e.to_string()))?,
            ),
            None => None,
        };
        loaded.cluster = Some(Credentials {
            token,
            ticket_key,
            ticket_rotation,
            reset_key: ResetKey(reset_key),
        });
        loaded.nodes = self.read_all(&tx, NODES, |name| format!("node {name:?}"))?;
        loaded.actors = self.read_all(&tx, ACTORS, |id| format!("actor {}", ActorId(id)))?;
        loaded.jobs = self.read_all(&tx, JOBS, |id| format!("job {id}"))?;
        loaded.records = self.read_all(&tx, RECORDS, |key| format!("library record {key:?}"))?;
        Ok(loaded)
    }

    /// Every record of `table`, decoded; `what` names a key in errors.
    fn read_all<K, T>(
        &self,
        tx: &redb::ReadTransaction,
        table: TableDefinition<K, &[u8]>,
        what: impl Fn(K::SelfType<'_>) -> String,
    ) -> Result<Vec<T>, StoreError>
    where
        K: redb::Key + 'static,
        T: serde::de::DeserializeOwned,
    {
        let unreadable = |source: redb::Error| StoreError::Unreadable {
            path: self.path.clone(),
            source,
        };
        let table = match tx.open_table(table) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
            Err(e) => return Err(unreadable(e.into())),
        };
        let mut records = Vec::new();
        for entry in table.iter().map_err(|e| unreadable(e.into()))? {
            let (key, value) = entry.map_err(|e| unreadable(e.into()))?;
            let record = rmp_serde::from_slice(value.value()).map_err(|e| StoreError::Corrupt {
                path: self.path.clone(),
                record: what(key.value()),
                detail: e.to_string(),
            })?;
            records.push(record);
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{ResourceSet, Versions};
    use crate::wire::{Incarnation, NodeIdentity};

    fn node(name: &str, incarnation: u64) -> StoredNode {
        StoredNode {
            registration: NodeRegistration {
                node: NodeIdentity {
                    name: name.into(),
                    incarnation: Incarnation(incarnation),
                },
                address: "127.0.0.1:7".parse().unwrap(),
                resources: ResourceSet::default(),
                versions: Versions::here(),
            },
            head: false,
            death_reason: None,
        }
    }

    #[test]
    fn what_is_written_is_read_back_by_the_next_head() {
        let dir = tempfile::tempdir().unwrap();
        let token = JoinToken::generate();
        let key = crate::transport::generate_pkcs8().unwrap();
        let credentials = Credentials {
            token: token.clone(),
            ticket_key: key.clone(),
            ticket_rotation: None,
            reset_key: ResetKey([7; 32]),
        };
        {
            let (store, loaded) = HeadStore::open(dir.path()).unwrap();
            assert!(!loaded.restarted());
            store.init(&credentials).unwrap();
            assert_eq!(store.next_epoch().unwrap(), 1);
            store.put_node(&node("a", 1)).unwrap();
            let rotated = crate::transport::generate_pkcs8().unwrap();
            let rotation = Rotation {
                next: rotated.clone(),
                switch_at: 5,
                done_at: 9,
            };
            store.save_ticket_keys(&key, &rotation).unwrap();
            let mut dead = node("b", 2);
            dead.death_reason = Some("left the cluster".into());
            store.put_node(&dead).unwrap();
            // A second head on the same store is refused while this one runs.
            let err = HeadStore::open(dir.path()).unwrap_err();
            assert!(matches!(err, StoreError::InUse { .. }), "{err}");
        }
        let (store, loaded) = HeadStore::open(dir.path()).unwrap();
        assert!(loaded.restarted());
        let cluster = loaded.cluster.unwrap();
        assert_eq!(cluster.token, token);
        assert_eq!(cluster.ticket_key, key);
        let rotation = cluster.ticket_rotation.unwrap();
        assert_eq!((rotation.switch_at, rotation.done_at), (5, 9));
        assert_eq!(cluster.reset_key, ResetKey([7; 32]));
        assert_eq!(loaded.nodes.len(), 2);
        assert_eq!(loaded.nodes[0], node("a", 1));
        assert_eq!(
            loaded.nodes[1].death_reason.as_deref(),
            Some("left the cluster")
        );
        assert_eq!(store.next_epoch().unwrap(), 2);
        let job = |id: &str| StoredJob {
            record: JobRecord {
                id: id.into(),
                name: None,
                submitted: false,
                entrypoint: "prog".into(),
                node: None,
                state: crate::cluster::JobState::Running,
                message: String::new(),
                exit: None,
                driver_pid: None,
                start_ms: 1,
                end_ms: None,
                versions: None,
            },
            stopping: false,
        };
        store.put_jobs(&[job("j1"), job("j2")], &[]).unwrap();
        store.put_jobs(&[job("j3")], &["j1".into()]).unwrap();
        drop(store);
        let (_, loaded) = HeadStore::open(dir.path()).unwrap();
        assert_eq!(loaded.jobs, [job("j2"), job("j3")]);
    }

    #[test]
    fn a_restarted_head_keeps_its_token_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let (token, first) = HeadStore::start(dir.path(), None).unwrap();
        assert!(!first.restarted);
        let first_key = first.reset_key.clone();
        drop(first);
        let (again, second) = HeadStore::start(dir.path(), Some(token.clone())).unwrap();
        assert!(second.restarted);
        assert_eq!(again, token);
        assert_eq!(second.reset_key, first_key);
        drop(second);
        let err = HeadStore::start(dir.path(), Some(JoinToken::generate())).unwrap_err();
        assert!(matches!(err, StoreError::OtherToken { .. }), "{err}");
    }

    #[test]
    fn a_store_left_by_a_first_start_that_died_before_its_credentials_reads_as_new() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = HeadStore::open(dir.path()).unwrap();
            assert_eq!(store.next_epoch().unwrap(), 1);
        }
        let (_, loaded) = HeadStore::open(dir.path()).unwrap();
        assert!(!loaded.restarted());
    }

    #[test]
    fn a_damaged_store_is_refused_naming_the_file_and_the_choices() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), vec![0x5a; 64 * 1024]).unwrap();
        let err = HeadStore::open(dir.path()).unwrap_err();
        let said = err.to_string();
        assert!(matches!(err, StoreError::Unreadable { .. }), "{said}");
        assert!(
            said.contains("head.redb") && said.contains("move it aside"),
            "{said}"
        );
    }

    #[test]
    fn a_record_that_does_not_decode_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (store, _) = HeadStore::open(dir.path()).unwrap();
            let credentials = Credentials {
                token: JoinToken::generate(),
                ticket_key: crate::transport::generate_pkcs8().unwrap(),
                ticket_rotation: None,
                reset_key: ResetKey([1; 32]),
            };
            store.init(&credentials).unwrap();
            store
                .write(|tx| {
                    tx.open_table(NODES)?.insert("a", [0xc1u8].as_slice())?;
                    Ok(())
                })
                .unwrap();
        }
        let err = HeadStore::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, StoreError::Corrupt { record, .. } if record == "node \"a\""),
            "{err}"
        );
    }
}
