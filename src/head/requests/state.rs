//! Libraries' record requests on the head (`crate::head::state`).

use crate::cluster::{StateReply, StateRequest};
use crate::head::HeadActors;
use crate::wire::{RemoteError, RemoteErrorKind};

use super::unavailable;

impl HeadActors {
    /// Answers a library-record request: a refused change (a limit, a
    /// malformed name) is a `BadRequest` naming it; a failed store write
    /// an `Internal` error; neither changes anything.
    pub async fn answer_state(&self, request: StateRequest) -> Result<StateReply, RemoteError> {
        self.state
            .send(request)
            .await
            .map_err(unavailable)?
            .map_err(|e| {
                let kind = match e.is_refusal() {
                    true => RemoteErrorKind::BadRequest,
                    false => RemoteErrorKind::Internal,
                };
                RemoteError::new(kind, e.to_string())
            })
    }
}
