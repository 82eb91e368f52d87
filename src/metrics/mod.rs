//! Prometheus metrics: what every process of a cluster records, and how a
//! node serves them on `/metrics` (`nimbus start --metrics-export-port`).
//!
//! Every process records through the [`metrics`] facade into a
//! `metrics-exporter-prometheus` recorder ([`install`]). A node serves its
//! own metrics and those of its worker processes and of the drivers whose
//! home it is:
//!
//! 1. Each worker or driver process renders its metrics every
//!    [`PUSH_INTERVAL`] and pushes the text to its node
//!    (`WorkerRequest::PushMetrics`; the node keys it by the caller's
//!    proven identity, so no process can overwrite another's), one push at
//!    a time. It pushes once more as it ends, so a run shorter than the
//!    interval loses nothing: a driver as it drops, a worker stopped with
//!    its job (the node SIGTERMs a job's workers, then SIGKILLs after 3 s),
//!    a training worker when its loop ends (before its supervisor stops
//!    it); each last push waits at most `LAST_PUSH_WAIT` (2 s). A worker
//!    whose actor dies or is killed goes at once, losing what it recorded
//!    since its last push.
//! 2. The node keeps each process's latest push ([`ProcessMetrics`]); a
//!    process silent for [`RETIRE_AFTER`] has ended and its counters stay
//!    in the sum, its gauges leave it.
//! 3. `GET /metrics` answers the sum of the node's own metrics and every
//!    process's, one block per family ([`MetricsServer`]).
//!
//! Labels are bounded: kinds of outcome, of cause, of worker; never an
//! actor, object or task id.
//!
//! | metric | type | labels | recorded by |
//! |---|---|---|---|
//! | `nimbus_actor_calls_total` | counter | `outcome` (`ok` or the error kind) | the caller |
//! | `nimbus_actor_call_seconds` | histogram | | the caller |
//! | `nimbus_tasks_submitted_total` | counter | | the driver |
//! | `nimbus_tasks_finished_total` | counter | `outcome` (`ok`, `failed`) | the driver |
//! | `nimbus_task_retries_total` | counter | | the driver |
//! | `nimbus_task_seconds` | histogram | | the driver (submission to result) |
//! | `nimbus_objects_put_bytes_total` | counter | | the putting process |
//! | `nimbus_object_store_bytes` | gauge | `where` (`memory`, `spilled`, `spare`: of memory, freed shared-memory files kept for reuse) | the node |
//! | `nimbus_object_store_spare_reuses_total` | counter | | the node (new objects written into a spare file) |
//! | `nimbus_object_store_capacity_bytes` | gauge | | the node |
//! | `nimbus_object_spills_total`, `nimbus_object_restores_total` | counter | | the node |
//! | `nimbus_object_transfers_total`, `nimbus_object_transfer_bytes_total` | counter | `path` (`tcp`: a bulk stream; `quic`) | the node (objects fetched from another node) |
//! | `nimbus_members` | gauge | `state` (`alive`, `dead`) | the head |
//! | `nimbus_node_deaths_total` | counter | | the head |
//! | `nimbus_heartbeat_delay_seconds` | histogram | | the head (time between a member's heartbeats) |
//! | `nimbus_workers_started_total` | counter | | the node |
//! | `nimbus_workers_died_total` | counter | `cause` (`DeathCause::kind`: `exited`, `signal`, `panicked`, ...) | the node |
//! | `nimbus_train_step_seconds` | histogram | | training workers (between reports) |
//! | `nimbus_train_samples_total` | counter | | training workers (`samples` of a report) |
//! | `nimbus_allreduce_seconds` | histogram | `backend` (`device`: NCCL on the GPU; `host`: the CPU collectives) | training workers |
//! | `nimbus_allreduce_bytes_total` | counter | `backend` | training workers |
//! | `nimbus_checkpoint_write_seconds` | histogram | | rank 0 |
//! | `nimbus_train_restarts_total` | counter | | the supervisor |
//! | `nimbus_train_recovery_seconds` | histogram | | the supervisor (failure to the next report) |
//! | `nimbus_train_heals_total` | counter | | the supervisor (workers replaced and healed from a peer) |
//! | `nimbus_train_heal_seconds` | histogram | | the supervisor (a heal's first death to the last replacement's first report) |
//! | `nimbus_connections_total` | counter | `direction` (`in`, `out`) | every process |
//! | `nimbus_handshakes_refused_total` | counter | | every process |

mod export;
mod http;
mod merge;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub use export::{MetricsError, MetricsServer};
pub use http::{max_connections, HttpThread, HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT};
pub use merge::{ProcessMetrics, PushError, MAX_PUSH_BYTES, RETIRE_AFTER};

/// How often a worker or driver pushes its metrics to its node.
pub const PUSH_INTERVAL: Duration = Duration::from_secs(5);

/// Histogram buckets for durations, in seconds: 50 µs to 5 min.
const SECONDS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
static NODE: OnceLock<Arc<Mutex<ProcessMetrics>>> = OnceLock::new();

/// Makes `processes` this node process's table of pushes (`node::run`
/// does), so that [`render_node`] sums them.
pub fn set_node_processes(processes: Arc<Mutex<ProcessMetrics>>) {
    let _ = NODE.set(processes);
}

/// What this node serves on `/metrics`: its own metrics and its
/// processes' pushes, summed (only its own outside a node process).
pub fn render_node() -> String {
    let own = render();
    let Some(processes) = NODE.get() else {
        return own;
    };
    let Ok(mut processes) = processes.lock() else {
        return own;
    };
    let mut out = String::new();
    processes.render(&own, Instant::now(), &mut out);
    out
}

/// The sum of the samples of metric `name` in Prometheus `text` whose
/// labels include each of `labels`.
pub fn total(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            metric == name
                && labels
                    .iter()
                    .all(|(key, value)| rest.contains(&format!("{key}=\"{value}\"")))
        })
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

/// Installs this process's recorder (once; later calls return the same
/// handle). `None` when another recorder was installed first (a program
/// of its own choosing): then nimbus records into that one.
pub fn install() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets(SECONDS)
                .ok()?
                .install_recorder()
                .ok()?;
            describe();
            Some(handle)
        })
        .as_ref()
}

/// This process's metrics as Prometheus text (empty without a recorder).
pub fn render() -> String {
    match install() {
        Some(handle) => {
            handle.run_upkeep();
            handle.render()
        }
        None => String::new(),
    }
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!("nimbus_actor_calls_total", "Actor calls made, by outcome.");
    describe_histogram!(
        "nimbus_actor_call_seconds",
        Unit::Seconds,
        "Actor call latency, as the caller sees it."
    );
    describe_counter!("nimbus_tasks_submitted_total", "Tasks submitted.");
    describe_counter!("nimbus_tasks_finished_total", "Tasks finished, by outcome.");
    describe_counter!("nimbus_task_retries_total", "Task attempts retried.");
    describe_histogram!(
        "nimbus_task_seconds",
        Unit::Seconds,
        "Task submission to result."
    );
    describe_counter!(
        "nimbus_objects_put_bytes_total",
        Unit::Bytes,
        "Bytes put into the object store."
    );
    describe_gauge!(
        "nimbus_object_store_bytes",
        Unit::Bytes,
        "Bytes the node's object store holds, in memory or spilled."
    );
    describe_gauge!(
        "nimbus_object_store_capacity_bytes",
        Unit::Bytes,
        "Bytes the node's object store may hold in memory."
    );
    describe_counter!("nimbus_object_spills_total", "Objects spilled to disk.");
    describe_counter!(
        "nimbus_object_store_spare_reuses_total",
        "New shared-memory objects written into a freed object's file."
    );
    describe_counter!("nimbus_object_restores_total", "Spilled objects read back.");
    describe_counter!(
        "nimbus_object_transfers_total",
        "Objects fetched from another node."
    );
    describe_counter!(
        "nimbus_object_transfer_bytes_total",
        Unit::Bytes,
        "Bytes of objects fetched from another node."
    );
    describe_gauge!("nimbus_members", "Nodes the head knows, by state.");
    describe_counter!("nimbus_node_deaths_total", "Nodes declared dead.");
    describe_histogram!(
        "nimbus_heartbeat_delay_seconds",
        Unit::Seconds,
        "Time between a member's heartbeats, at the head."
    );
    describe_counter!("nimbus_workers_started_total", "Worker processes started.");
    describe_counter!(
        "nimbus_workers_died_total",
        "Worker processes ended, by cause."
    );
    describe_histogram!(
        "nimbus_train_step_seconds",
        Unit::Seconds,
        "Time between a training worker's reports."
    );
    describe_counter!(
        "nimbus_train_samples_total",
        "Training samples processed (reported as `samples`)."
    );
    describe_histogram!(
        "nimbus_allreduce_seconds",
        Unit::Seconds,
        "Allreduce time, by backend."
    );
    describe_counter!(
        "nimbus_allreduce_bytes_total",
        Unit::Bytes,
        "Bytes allreduced, by backend."
    );
    describe_histogram!(
        "nimbus_checkpoint_write_seconds",
        Unit::Seconds,
        "Checkpoint write time."
    );
    describe_counter!(
        "nimbus_train_restarts_total",
        "Training attempts restarted."
    );
    describe_histogram!(
        "nimbus_train_recovery_seconds",
        Unit::Seconds,
        "A training failure to the next report."
    );
    describe_counter!(
        "nimbus_train_heals_total",
        "Training groups healed from a live peer."
    );
    describe_histogram!(
        "nimbus_train_heal_seconds",
        Unit::Seconds,
        "A heal's first death to its last replacement's first report."
    );
    describe_counter!(
        "nimbus_connections_total",
        "QUIC connections established, by direction."
    );
    describe_counter!(
        "nimbus_handshakes_refused_total",
        "Connections refused at the handshake (bad proof or certificate)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_the_series_with_the_labels_asked() {
        let text = "# TYPE calls_total counter\ncalls_total{outcome=\"ok\"} 3\ncalls_total{outcome=\"timeout\"} 2\ncalls_total_other 9\n";
        assert_eq!(total(text, "calls_total", &[]), 5.0);
        assert_eq!(total(text, "calls_total", &[("outcome", "ok")]), 3.0);
        assert_eq!(total(text, "absent", &[]), 0.0);
    }
}
