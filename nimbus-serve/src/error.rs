//! What can go wrong with serving: a user handler's own errors (answered
//! as HTTP statuses) and the errors of deploying and managing
//! applications, each naming the deployment, node or setting concerned.

use nimbus::actor::{CallError, SpawnError};
use serde::{Deserialize, Serialize};

/// A deployment's `call` failed: answered as `400` or `500` with the text
/// as the JSON body's `error`; the replica keeps serving.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// The request is wrong (a shape or value the model cannot take): 400.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The handler failed on a valid request: 500.
    #[error("{0}")]
    Failed(String),
}

/// A [`DeploymentHandle`](crate::DeploymentHandle) call failed, naming the
/// application called.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// Called outside a replica of nimbus Serve: no controller to ask.
    #[error("a DeploymentHandle calls only from inside a replica's call (no serve controller is known here)")]
    NotInReplica,
    /// The controller could not be asked, or refused (no such
    /// application).
    #[error("{0}")]
    Controller(String),
    /// The request did not encode as JSON.
    #[error("the request to {application} does not encode: {detail}")]
    Encode {
        /// The application called.
        application: String,
        /// Why.
        detail: String,
    },
    /// The answer did not decode as the deployment's response.
    #[error("the answer of {application} does not decode: {detail}")]
    Decode {
        /// The application called.
        application: String,
        /// Why.
        detail: String,
    },
    /// The deployment answered with an error status (its `HandlerError`).
    #[error("{application} answered {status}: {body}")]
    Status {
        /// The application called.
        application: String,
        /// The HTTP status it would have answered.
        status: u16,
        /// Its JSON body.
        body: String,
    },
    /// No replica took the call.
    #[error("no replica of {application} took the call in {attempts} tries: {last}")]
    Unavailable {
        /// The application called.
        application: String,
        /// Replicas tried.
        attempts: u32,
        /// The last one's failure.
        last: String,
    },
}

/// Serving could not be started, changed, asked or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting is out of range or malformed.
    #[error("{setting}: {detail}")]
    Setting {
        /// The setting (`route_prefix`, `num_replicas`, ...).
        setting: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// An actor of serving (controller, ingress or replica) could not be
    /// spawned.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which actor, in words.
        what: String,
        /// Why.
        #[source]
        source: SpawnError,
    },
    /// An actor of serving did not answer.
    #[error("{what} did not answer: {source}")]
    Call {
        /// Which actor and what was asked, in words.
        what: String,
        /// Why.
        #[source]
        source: CallError,
    },
    /// The controller refused or failed a request.
    #[error(transparent)]
    Controller(#[from] ControllerError),
    /// The cluster could not be asked (its nodes, to place ingresses).
    #[error(transparent)]
    Library(#[from] nimbus::library::LibraryError),
}

/// What the controller answers when a request of the driver fails.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum ControllerError {
    /// An ingress could not listen on its address.
    #[error("the HTTP ingress on node {node} cannot listen on {address}: {detail} (choose another HttpOptions::port, or free that one)")]
    Listen {
        /// The node.
        node: String,
        /// The address asked for.
        address: String,
        /// What the operating system said.
        detail: String,
    },
    /// An actor could not be spawned (an ingress, a replica).
    #[error("cannot start {what}: {detail}")]
    Spawn {
        /// Which actor, in words.
        what: String,
        /// Why.
        detail: String,
    },
    /// A deployment's replicas could not be built or did not become
    /// healthy in time; nothing of the new version serves.
    #[error("deployment {deployment} failed: {detail}")]
    Deploy {
        /// The deployment.
        deployment: String,
        /// Why, as its replica said.
        detail: String,
    },
    /// Another application already serves that route prefix.
    #[error("route prefix {prefix} is served by application {by}: give {application} another route_prefix, or delete {by} first")]
    RouteTaken {
        /// The prefix.
        prefix: String,
        /// The application serving it.
        by: String,
        /// The application asking for it.
        application: String,
    },
    /// No application of that name is deployed.
    #[error("no application named {0} is deployed")]
    NoApplication(String),
    /// A restarted controller could not read its saved state yet (the
    /// head is unreachable): nothing was changed.
    #[error("the serve controller is restarting and cannot read its saved state yet (is the head up?); try again")]
    Restoring,
}
