//! Event requests and fault reports on the head: the long poll of the
//! numbered events, the latest one's number, and the reports of injected
//! faults and recoveries, published as events (`crate::head::events`).

use std::time::Duration;

use crate::cluster::faults::FiredFault;
use crate::cluster::{ClusterEventKind, EventReply, EventRequest, FaultReply, FaultRequest};
use crate::head::events::{EventsSince, LastSeq, Publish};
use crate::head::{directory, HeadActors};
use crate::wire::{RemoteError, RemoteErrorKind};

use super::unavailable;

/// Longest a client may long-poll for events in one request.
const MAX_EVENT_WAIT: Duration = Duration::from_secs(60);

impl HeadActors {
    /// Answers an event request: a long poll waits at most
    /// `MAX_EVENT_WAIT` (60 s).
    pub async fn answer_events(&self, request: EventRequest) -> Result<EventReply, RemoteError> {
        match request {
            EventRequest::Events { after, wait_ms } => {
                let wait = Duration::from_millis(wait_ms).min(MAX_EVENT_WAIT);
                let since = self
                    .events
                    .send(EventsSince { after, wait })
                    .await
                    .map_err(unavailable)?;
                Ok(EventReply::Events(since))
            }
            EventRequest::LastSeq => {
                let last = self.events.send(LastSeq).await.map_err(unavailable)?;
                Ok(EventReply::LastSeq(last))
            }
        }
    }
}

impl HeadActors {
    /// A `ReportFault` that kills a node (`kills_node`) first tells the
    /// directory (`NodeDoomed`), so the actors lost with that node carry the
    /// fault in their death cause; every report is then published as an event.
    pub async fn answer_faults(&self, request: FaultRequest) -> Result<FaultReply, RemoteError> {
        let kind = match request {
            FaultRequest::ReportFault {
                fault,
                target,
                trigger,
                kills_node,
            } => {
                if let Some(node) = kills_node {
                    let fault = FiredFault::new(&fault, &trigger, &target);
                    self.directory
                        .send(directory::NodeDoomed { node, fault })
                        .await
                        .map_err(unavailable)?;
                }
                ClusterEventKind::FaultInjected {
                    fault,
                    target,
                    trigger,
                }
            }
            FaultRequest::ReportRecovery {
                what,
                target,
                took_ms,
            } => ClusterEventKind::Recovered {
                what,
                target,
                took_ms,
            },
            FaultRequest::ReportPacketFaults {
                process,
                class,
                counts,
                rule_hits,
            } => ClusterEventKind::PacketFaults {
                process,
                class,
                counts,
                rule_hits,
            },
            FaultRequest::AddPacketRule(_) => {
                return Err(RemoteError::new(
                    RemoteErrorKind::Internal,
                    "a packet rule reached the head's dispatcher",
                ))
            }
        };
        self.events.send(Publish(kind)).await.map_err(unavailable)?;
        Ok(FaultReply::Ack)
    }
}
