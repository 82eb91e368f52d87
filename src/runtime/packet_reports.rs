//! Reporting what a process's packet-fault plan actually did: a process
//! whose socket injects packet faults (a chaos plan's) tells the head its
//! counters, which the head publishes as `PacketFaults` events for the
//! chaos runner's timeline.
//!
//! 1. Every [`REPORT_EVERY`], the process reads its socket's counters.
//! 2. If the faults counted changed since the last report the head
//!    acknowledged, it sends `ReportPacketFaults` with the counters since
//!    it started (so a lost report loses nothing: the next one carries it).
//! 3. It stops with the process; a process without a plan never starts.
//!    A driver that ends sends its last counters on its way out
//!    ([`packet_report`], from `Driver`'s drop), so a short program's
//!    faults are not lost between two reports.

use std::net::SocketAddr;
use std::time::Duration;

use crate::client::{self, ClientError};
use crate::cluster::{FaultRequest, ProcessClass};
use crate::transport::{Endpoint, FaultCounts, RequestOptions};

/// How often a process with a packet-fault plan looks at its counters.
pub const REPORT_EVERY: Duration = Duration::from_millis(500);

/// `endpoint`'s packet-fault counters now, and the report that tells the
/// head of them (as `process`, of kind `class`); `None` if its socket has
/// no plan.
pub fn packet_report(
    endpoint: &Endpoint,
    process: &str,
    class: ProcessClass,
) -> Option<(FaultCounts, FaultRequest)> {
    let counters = endpoint.fault_counters()?;
    let counts = counters.snapshot();
    let report = FaultRequest::ReportPacketFaults {
        process: process.to_string(),
        class,
        counts,
        rule_hits: counters.rule_hits(),
    };
    Some((counts, report))
}

/// Starts reporting `endpoint`'s packet-fault counters to the head at
/// `head` as `process` (of kind `class`), if its socket has a plan. Call
/// it inside the process's runtime.
pub fn report_packet_faults(
    endpoint: Endpoint,
    head: SocketAddr,
    process: String,
    class: ProcessClass,
) {
    if endpoint.fault_counters().is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut reported = FaultCounts::default();
        let mut tick = tokio::time::interval(REPORT_EVERY);
        loop {
            tick.tick().await;
            let Some((now, report)) = packet_report(&endpoint, &process, class) else {
                return;
            };
            if now.faulted() == reported.faulted() {
                continue;
            }
            let sent = async {
                let head = endpoint
                    .connect(head, None)
                    .await
                    .map_err(ClientError::from)?;
                client::call(&head, report, RequestOptions::control()).await
            };
            match sent.await {
                Ok(_) => reported = now,
                Err(e) => tracing::debug!("packet-fault counters not reported: {e}"),
            }
        }
    });
}
