//! Membership requests on the head: joins (answered with the node's
//! ticket), heartbeats, leaves, the status, the autoscaler's reports and
//! requests for resources (`crate::head::membership`).

use crate::cluster::{MembershipReply, MembershipRequest, MAX_REQUESTED_BUNDLES};
use crate::head::{membership, HeadActors};
use crate::transport::{unix_now, Caller};
use crate::wire::{HeadKeys, NodeIdentity, PeerRole, RemoteError, RemoteErrorKind, Ticket};

use super::unavailable;

impl HeadActors {
    /// A ticket for `node`, for the certificate `from` connected with, whose
    /// workers' tickets `signs_workers` signs, and the head's public keys
    /// to check other peers' tickets with (a join or a renewal).
    fn ticket_for(
        &self,
        node: &NodeIdentity,
        from: &Caller,
        signs_workers: &[u8],
    ) -> (Ticket, HeadKeys) {
        let now = unix_now();
        let ticket = self
            .tickets
            .certify_node(node, from.certificate, signs_workers, now);
        (ticket, self.tickets.public_keys(now).into())
    }

    /// Answers a membership request from `from`.
    pub async fn answer_membership(
        &self,
        from: Caller,
        request: MembershipRequest,
    ) -> Result<MembershipReply, RemoteError> {
        let membership = &self.membership;
        match request {
            MembershipRequest::Join {
                registration,
                signs_workers,
            } => {
                if from.peer.role != PeerRole::Node || from.peer.identity != registration.node {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!("{from} cannot join as {}", registration.node),
                    ));
                }
                let node = registration.node.clone();
                let join = membership::Join {
                    registration,
                    head: false,
                };
                match membership.send(join).await.map_err(unavailable)? {
                    Ok(()) => {
                        let (ticket, head_keys) = self.ticket_for(&node, &from, &signs_workers);
                        Ok(MembershipReply::Joined {
                            heartbeat_interval_ms: self.heartbeat_interval.as_millis() as u64,
                            ticket,
                            head_keys,
                        })
                    }
                    Err(membership::MembershipError::NameTaken {
                        holder,
                        address,
                        retry_after,
                        ..
                    }) => Ok(MembershipReply::NodeNameTaken {
                        holder,
                        address,
                        retry_after_ms: retry_after.map(|d| d.as_millis() as u64),
                    }),
                    Err(e) => Err(e.into()),
                }
            }
            MembershipRequest::Heartbeat {
                node,
                used,
                host,
                renew,
            } => {
                let beat = membership::Heartbeat {
                    node: node.clone(),
                    used,
                    host,
                };
                membership.send(beat).await.map_err(unavailable)??;
                // A live member's only: the heartbeat was accepted.
                Ok(match renew {
                    Some(signs_workers) => {
                        let (ticket, head_keys) = self.ticket_for(&node, &from, &signs_workers);
                        MembershipReply::Renewed { ticket, head_keys }
                    }
                    None => MembershipReply::Ack,
                })
            }
            MembershipRequest::Leave { node } => {
                membership
                    .send(membership::Leave { node })
                    .await
                    .map_err(unavailable)??;
                Ok(MembershipReply::Ack)
            }
            MembershipRequest::Status => {
                let status = membership
                    .send(membership::Status)
                    .await
                    .map_err(unavailable)?;
                Ok(MembershipReply::Status(status))
            }
            MembershipRequest::RotateTicketKey => {
                let refused = |e: String| RemoteError::new(RemoteErrorKind::BadRequest, e);
                let (current, rotation) = self
                    .tickets
                    .rotate(unix_now())
                    .map_err(|e| refused(e.to_string()))?;
                self.store
                    .save_ticket_keys(&current, &rotation)
                    .map_err(|e| RemoteError::new(RemoteErrorKind::Internal, e.to_string()))?;
                tracing::info!(
                    "rotating the ticket key on {from}'s request: the new key signs from {} and the old one is accepted until {} (Unix seconds)",
                    rotation.switch_at,
                    rotation.done_at
                );
                Ok(MembershipReply::TicketKeyRotating {
                    switch_at: rotation.switch_at,
                    done_at: rotation.done_at,
                })
            }
            MembershipRequest::Autoscaler(report) => {
                membership.do_send(membership::Report(report));
                Ok(MembershipReply::Ack)
            }
            MembershipRequest::RequestResources { bundles } => {
                if bundles.len() > MAX_REQUESTED_BUNDLES {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!(
                            "{from} requested {} bundles; at most {MAX_REQUESTED_BUNDLES} are kept",
                            bundles.len()
                        ),
                    ));
                }
                if let Some((index, e)) = bundles
                    .iter()
                    .enumerate()
                    .find_map(|(i, b)| b.validate().err().map(|e| (i, e)))
                {
                    return Err(RemoteError::new(
                        RemoteErrorKind::BadRequest,
                        format!("{from} requested bundle {index}: {e}"),
                    ));
                }
                membership.do_send(membership::Request(bundles));
                Ok(MembershipReply::Ack)
            }
        }
    }
}
