//! What the pages show, fetched from the head through a
//! [`ClusterClient`] and kept for [`REFRESH`] so that any number of open
//! pages cost the control plane at most one listing of each kind per
//! interval; paging and filtering happen here, never at the head.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::client::{ClientError, ClusterClient, Listing, Row};
use crate::cluster::{ClusterEventKind, NodeState};
use crate::transport::JoinToken;

/// A listing younger than this is served from the cache.
pub const REFRESH: Duration = Duration::from_secs(1);
/// Rows per page unless the page asks for fewer (at most [`MAX_PAGE`]).
pub(crate) const DEFAULT_PAGE: usize = 100;
/// The most rows one request returns.
pub const MAX_PAGE: usize = 1000;

/// One page of a filtered listing.
#[derive(Debug, Serialize)]
pub(crate) struct Page {
    /// Rows matching the filter, all pages.
    pub total: usize,
    /// Rows in the listing before filtering.
    pub unfiltered: usize,
    /// Index of the first row returned.
    pub offset: usize,
    /// The rows.
    pub rows: Vec<Row>,
}

/// Rows of `rows` whose cells contain `filter` (case-insensitive; every
/// word of it, in any cell), from `offset`, at most `limit`.
pub(crate) fn page(rows: &[Row], filter: &str, offset: usize, limit: usize) -> Page {
    let words: Vec<String> = filter.split_whitespace().map(str::to_lowercase).collect();
    let matches = |row: &Row| {
        words.iter().all(|word| {
            row.values()
                .any(|value| cell_text(value).to_lowercase().contains(word))
        })
    };
    let matching: Vec<&Row> = rows.iter().filter(|row| matches(row)).collect();
    let limit = limit.clamp(1, MAX_PAGE);
    Page {
        total: matching.len(),
        unfiltered: rows.len(),
        offset,
        rows: matching
            .into_iter()
            .skip(offset)
            .take(limit)
            .cloned()
            .collect(),
    }
}

/// A cell as text: strings without their quotes.
fn cell_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The dashboard's connection to the head and its cache of listings.
pub(crate) struct Views {
    head: SocketAddr,
    token: JoinToken,
    client: Mutex<Option<Arc<ClusterClient>>>,
    cache: Mutex<HashMap<&'static str, (Instant, Vec<Row>)>>,
    cluster: Mutex<Option<(Instant, Value)>>,
    activity: Mutex<std::collections::VecDeque<ActivitySample>>,
}

impl Views {
    /// Views of the cluster whose head is at `head`.
    pub(crate) fn new(head: SocketAddr, token: JoinToken) -> Self {
        Views {
            head,
            token,
            client: Mutex::new(None),
            cache: Mutex::new(HashMap::new()),
            cluster: Mutex::new(None),
            activity: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// The cluster page's data: every node with its resources and its
    /// object store's use, and the spawns waiting for room.
    pub(crate) async fn cluster(&self) -> Result<Value, ClientError> {
        let mut cached = self.cluster.lock().await;
        if let Some((at, value)) = cached.as_ref() {
            if at.elapsed() < REFRESH {
                return Ok(value.clone());
            }
        }
        let value = self
            .with_client(async |client| {
                let status = client.status().await?;
                let mut nodes = Vec::new();
                for node in &status.nodes {
                    let mut row = serde_json::to_value(node).unwrap_or_default();
                    if node.state == NodeState::Alive {
                        // A node that died since the status was read is
                        // shown without its store, not as an error.
                        if let Ok(store) = client.objects(node).await {
                            row["object_store"] = json!({
                                "used": store.used,
                                "spare": store.spare,
                                "capacity": store.capacity,
                                "spilled": store.spilled,
                                "objects": store.objects.len(),
                            });
                        }
                    }
                    nodes.push(row);
                }
                let pending = client.demands().await?;
                Ok(json!({ "nodes": nodes, "pending": pending }))
            })
            .await?;
        *cached = Some((Instant::now(), value.clone()));
        Ok(value)
    }

    /// `what`'s rows, from the cache when fresh.
    pub(crate) async fn rows(&self, what: Listing) -> Result<Vec<Row>, ClientError> {
        let key = key(what);
        let mut cache = self.cache.lock().await;
        if let Some((at, rows)) = cache.get(key) {
            if at.elapsed() < REFRESH {
                return Ok(rows.clone());
            }
        }
        let rows = self
            .with_client(async |client| client.list(what).await)
            .await?;
        cache.insert(key, (Instant::now(), rows.clone()));
        Ok(rows)
    }

    /// Runs `f` with a client connected to the head, connecting first if
    /// none is; a failed call drops the client, so the next one
    /// reconnects. Calls run concurrently (a long poll holds no lock).
    pub(crate) async fn with_client<T>(
        &self,
        f: impl AsyncFnOnce(&ClusterClient) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let client = {
            let mut slot = self.client.lock().await;
            match slot.as_ref() {
                Some(client) => client.clone(),
                None => {
                    let client = Arc::new(
                        ClusterClient::connect(&self.head.to_string(), &self.token).await?,
                    );
                    *slot = Some(client.clone());
                    client
                }
            }
        };
        let result = f(&client).await;
        if result.is_err() {
            let mut slot = self.client.lock().await;
            if slot
                .as_ref()
                .is_some_and(|current| Arc::ptr_eq(current, &client))
            {
                *slot = None;
            }
        }
        result
    }
}

/// Activity samples kept (at one per `TICK` or faster: minutes).
pub(crate) const ACTIVITY: usize = 300;

/// Counters of the head node and its processes at one time
/// (`crate::metrics::render_node`), for the cluster page's charts.
#[derive(Clone, Debug, serde::Serialize)]
pub(crate) struct ActivitySample {
    /// Unix milliseconds.
    pub time_ms: u64,
    /// `nimbus_actor_calls_total`.
    pub actor_calls: f64,
    /// `nimbus_tasks_finished_total`.
    pub tasks_finished: f64,
    /// `nimbus_objects_put_bytes_total`.
    pub put_bytes: f64,
}

impl Views {
    /// Takes an activity sample now, keeping the last [`ACTIVITY`].
    pub(crate) async fn sample_activity(&self) {
        let text = crate::metrics::render_node();
        let total = |name| crate::metrics::total(&text, name, &[]);
        let sample = ActivitySample {
            time_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            actor_calls: total("nimbus_actor_calls_total"),
            tasks_finished: total("nimbus_tasks_finished_total"),
            put_bytes: total("nimbus_objects_put_bytes_total"),
        };
        let mut samples = self.activity.lock().await;
        samples.push_back(sample);
        while samples.len() > ACTIVITY {
            samples.pop_front();
        }
    }

    /// The activity samples kept, oldest first.
    pub(crate) async fn activity(&self) -> Vec<ActivitySample> {
        self.activity.lock().await.iter().cloned().collect()
    }
}

/// The most events the timeline shows.
pub(crate) const TIMELINE: u64 = 500;

impl Views {
    /// The cluster's last [`TIMELINE`] events but resource changes, newest
    /// first, each as `{seq, time_ms, kind, text}`.
    pub(crate) async fn timeline(&self) -> Result<Vec<Value>, ClientError> {
        self.with_client(async |client| {
            let last = client.last_event_seq().await?;
            let events = client
                .events(last.saturating_sub(TIMELINE), std::time::Duration::ZERO)
                .await?;
            Ok(events
                .iter()
                .rev()
                .filter_map(|event| {
                    let (kind, text) = describe(&event.kind)?;
                    Some(json!({
                        "seq": event.seq,
                        "time_ms": event.time_ms,
                        "kind": kind,
                        "text": text,
                    }))
                })
                .collect())
        })
        .await
    }
}

/// An event's kind and what it says, for people; `None` for resource
/// changes (every heartbeat may bring one).
fn describe(kind: &ClusterEventKind) -> Option<(&'static str, String)> {
    Some(match kind {
        ClusterEventKind::NodeJoined { node, address } => {
            ("node joined", format!("{node} at {address}"))
        }
        ClusterEventKind::NodeLeft { node } => ("node left", node.to_string()),
        ClusterEventKind::NodeDead { node, reason } => ("node dead", format!("{node}: {reason}")),
        ClusterEventKind::JobEnded { job, reason } => ("job ended", format!("{job}: {reason}")),
        ClusterEventKind::ActorStarted {
            actor, name, node, ..
        } => (
            "actor started",
            match name {
                Some(name) => format!("{name} ({actor}) on {node}"),
                None => format!("{actor} on {node}"),
            },
        ),
        ClusterEventKind::ActorDied {
            actor,
            reason,
            restarting,
            ..
        } => (
            "actor died",
            format!(
                "{actor}: {reason}{}",
                if *restarting { "; restarting" } else { "" }
            ),
        ),
        ClusterEventKind::FaultInjected {
            fault,
            target,
            trigger,
        } => (
            "fault injected",
            format!("{fault} on {target} at {trigger}"),
        ),
        ClusterEventKind::Recovered {
            what,
            target,
            took_ms,
        } => (
            "recovered",
            format!("{what} ({target}) in {:.1} s", *took_ms as f64 / 1000.0),
        ),
        ClusterEventKind::PacketFaults { process, .. } => {
            ("packet faults", format!("counted in {process}"))
        }
        ClusterEventKind::Autoscaler { decision } => ("autoscaler", decision.clone()),
        // The timeline reads a window of the kept events, not a stream:
        // the marker for the window's start says nothing.
        ClusterEventKind::ResourcesChanged { .. } | ClusterEventKind::Resync { .. } => return None,
    })
}

/// A listing's name in the API (`/api/NAME`).
pub(crate) fn key(what: Listing) -> &'static str {
    match what {
        Listing::Actors => "actors",
        Listing::Nodes => "nodes",
        Listing::Objects => "objects",
        Listing::Jobs => "jobs",
        Listing::PlacementGroups => "placement-groups",
        Listing::Tasks => "tasks",
        Listing::Runs => "runs",
    }
}

/// The listing named `name` in the API.
pub(crate) fn listing(name: &str) -> Option<Listing> {
    [
        Listing::Actors,
        Listing::Nodes,
        Listing::Objects,
        Listing::Jobs,
        Listing::PlacementGroups,
        Listing::Tasks,
        Listing::Runs,
    ]
    .into_iter()
    .find(|what| key(*what) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Vec<Row> {
        (0..n)
            .map(|i| {
                let Value::Object(row) = json!({"name": format!("account-{i}"), "state": if i % 2 == 0 { "ALIVE" } else { "DEAD" }}) else {
                    unreachable!()
                };
                row
            })
            .collect()
    }

    #[test]
    fn pages_filter_every_word_case_insensitively() {
        let all = rows(10_000);
        let page = page(&all, "alive ACCOUNT-99", 0, 100);
        // account-99 is odd (DEAD); account-990..998 even ones are ALIVE.
        assert_eq!(page.unfiltered, 10_000);
        assert!(page.rows.iter().all(|r| r["state"] == "ALIVE"));
        assert_eq!(page.total, 55);
        assert_eq!(page.rows.len(), 55);
    }

    #[test]
    fn pages_are_bounded_and_offset() {
        let all = rows(3000);
        let second = page(&all, "", 100, 100);
        assert_eq!(
            (second.total, second.offset, second.rows.len()),
            (3000, 100, 100)
        );
        assert_eq!(second.rows[0]["name"], "account-100");
        assert_eq!(page(&all, "", 0, 1_000_000).rows.len(), MAX_PAGE);
        assert!(page(&all, "", 5000, 10).rows.is_empty());
    }

    #[test]
    fn every_listing_has_a_name() {
        for name in [
            "actors",
            "nodes",
            "objects",
            "jobs",
            "placement-groups",
            "tasks",
        ] {
            assert_eq!(key(listing(name).unwrap()), name);
        }
        assert!(listing("secrets").is_none());
    }
}
