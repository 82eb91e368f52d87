//! The head's side of the control protocol: each head subsystem's
//! requests, checked and answered by the head's actors. The node service
//! (`crate::node`'s `service.rs`) authorizes a request and routes it here;
//! a node that is not the head refuses them.
//!
//! One file per subsystem, each an `impl HeadActors` block returning the
//! subsystem's reply type: `membership.rs` ([`MembershipRequest`]),
//! `events.rs` ([`EventRequest`], and [`FaultRequest`]'s reports),
//! `directory.rs` ([`DirectoryRequest`]), `jobs.rs` ([`JobRequest`]),
//! `state.rs` ([`StateRequest`]).

#[cfg(doc)]
use crate::cluster::{
    DirectoryRequest, EventRequest, FaultRequest, JobRequest, MembershipRequest, StateRequest,
};
use crate::wire::{RemoteError, RemoteErrorKind};

mod directory;
mod events;
mod jobs;
mod membership;
mod state;

/// A head or node actor that has stopped, as the error a caller reads.
pub(crate) fn unavailable(e: actix::MailboxError) -> RemoteError {
    RemoteError::new(
        RemoteErrorKind::Internal,
        format!("node actor unavailable: {e}"),
    )
}
