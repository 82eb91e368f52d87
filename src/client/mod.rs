//! Talking to a cluster from outside it: the CLI, drivers, tests and
//! benchmarks use a [`ClusterClient`]; node managers use [`call`] to reach
//! the head.
//!
//! ```no_run
//! # async fn demo() -> Result<(), nimbus::client::ClientError> {
//! use nimbus::client::ClusterClient;
//! let token = "nimbus1-...".parse().map_err(nimbus::client::ClientError::from)?;
//! let client = ClusterClient::connect("127.0.0.1:6379", &token).await?;
//! for node in client.status().await?.nodes {
//!     println!("{} {:?} {}", node.id, node.state, node.resources.total);
//! }
//! # Ok(()) }
//! ```

mod actors;
mod jobs;
mod listing;

pub use crate::cluster::LogChunk;
pub use jobs::{pack, WorkingDir, MAX_WORKING_DIR, PRIVATE_NAMES};
pub use listing::{job_row, Listing, Row};

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::cluster::{
    ClusterEvent, ClusterStatus, ControlReply, ControlRequest, Echo, EventReply, EventRequest,
    MembershipReply, MembershipRequest, NodeStatus, ObjectListing, ObjectReply, ObjectRequest,
    Subsystem, UnexpectedReply,
};
use crate::transport::{
    ConnectError, Connection, CredentialError, Credentials, Endpoint, EndpointError, JoinToken,
    RequestError, RequestOptions, TransportConfig,
};
use crate::wire::{self, Incarnation, NodeIdentity, PeerIdentity, PeerRole, WireError};

/// What can go wrong talking to a cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not `HOST:PORT` or does not resolve.
    #[error("bad address {address:?}: {detail}")]
    BadAddress {
        /// What was given.
        address: String,
        /// Why it is unusable.
        detail: String,
    },
    /// The token is malformed.
    #[error(transparent)]
    Credentials(#[from] CredentialError),
    /// The local endpoint could not start.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The node could not be reached or refused us.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// A request failed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A message could not be encoded or decoded.
    #[error("control message: {0}")]
    Wire(#[from] WireError),
    /// The node answered with a reply of the wrong kind.
    #[error(transparent)]
    Unexpected(#[from] UnexpectedReply),
    /// What was asked for is not in the cluster.
    #[error("no {what} in the cluster")]
    NotFound {
        /// What was looked for.
        what: String,
    },
    /// A job's working directory could not be packed.
    #[error("cannot pack the working directory {dir}: {detail}")]
    WorkingDir {
        /// The directory.
        dir: String,
        /// Why.
        detail: String,
    },
    /// A wait ran past its deadline.
    #[error("{what} did not happen within {after:?}")]
    Deadline {
        /// What was awaited.
        what: String,
        /// The deadline.
        after: Duration,
    },
}

/// Sends one request of a subsystem on `connection` and decodes its reply
/// (another subsystem's reply is [`ClientError::Unexpected`]).
pub async fn call<R: Subsystem>(
    connection: &Connection,
    request: R,
    options: RequestOptions,
) -> Result<R::Reply, ClientError> {
    let reply = exchange(connection, &request.into(), options).await?;
    Ok(R::expect(reply)?)
}

/// Sends one control request on `connection` and decodes the reply,
/// whatever its subsystem (the typed [`call`] checks it): for a request
/// sent again and again without copying it.
pub async fn exchange(
    connection: &Connection,
    request: &ControlRequest,
    options: RequestOptions,
) -> Result<ControlReply, ClientError> {
    let body = rmp_serde::to_vec_named(request).map_err(|e| WireError::Encode {
        what: "ControlRequest",
        detail: e.to_string(),
    })?;
    let reply = connection.request(body, options).await?;
    Ok(wire::decode(&reply)?)
}

impl ClientError {
    /// Whether the peer could not be reached or its connection is gone
    /// (it answered nothing): what a restarting head looks like. A request
    /// that timed out on a live connection is not (the peer may be slow).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            ClientError::Connect(ConnectError::Unreachable { .. } | ConnectError::Lost { .. })
                | ClientError::Request(RequestError::NodeLost { .. } | RequestError::Closed { .. })
        )
    }
}

/// Cluster events after sequence number `after`, asked of the head on
/// `head`, waiting up to `wait` for one (a long poll).
pub async fn events(
    head: &Connection,
    after: u64,
    wait: Duration,
) -> Result<Vec<ClusterEvent>, ClientError> {
    let request = EventRequest::Events {
        after,
        wait_ms: wait.as_millis() as u64,
    };
    let options = RequestOptions::control().with_deadline(wait + Duration::from_secs(10));
    match call(head, request, options).await? {
        EventReply::Events(events) => Ok(events),
        reply => Err(UnexpectedReply::new("Events", reply).into()),
    }
}

/// What the object store of the node on `node` holds.
pub async fn list_objects(node: &Connection) -> Result<ObjectListing, ClientError> {
    match call(node, ObjectRequest::ListObjects, RequestOptions::control()).await? {
        ObjectReply::Listing(listing) => Ok(listing),
        reply => Err(UnexpectedReply::new("ListObjects", reply).into()),
    }
}

/// The number of the head's latest event: the events after it are new.
pub async fn last_event_seq(head: &Connection) -> Result<u64, ClientError> {
    match call(head, EventRequest::LastSeq, RequestOptions::control()).await? {
        EventReply::LastSeq(last) => Ok(last),
        reply => Err(UnexpectedReply::new("LastSeq", reply).into()),
    }
}

/// Resolves `HOST:PORT`.
pub fn resolve(address: &str) -> Result<SocketAddr, ClientError> {
    use std::net::ToSocketAddrs;
    let bad = |detail: String| ClientError::BadAddress {
        address: address.to_string(),
        detail,
    };
    address
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("resolves to no address".into()))
}

/// The first wait before asking an unreachable head again.
const HEAD_RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between asks of an unreachable head.
const HEAD_RETRY_MAX: Duration = Duration::from_secs(2);

/// How long idempotent head requests wait for an unreachable head: the
/// head's grace as this process's environment says (`NIMBUS_HEAD_GRACE_S`,
/// which workers inherit from their node), else its default.
pub fn head_wait() -> Duration {
    std::env::var("NIMBUS_HEAD_GRACE_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(crate::cluster::DEFAULT_HEAD_GRACE, Duration::from_secs)
}

/// Asks the head at `head` with `ask`, over `endpoint`'s connection to it
/// (made anew when the last one broke). When the head is unreachable and
/// `again` (the request is idempotent: [`ControlRequest::is_idempotent`]),
/// asks again on a new connection, with backoff, until [`head_wait`] has
/// passed: a restarting head delays the request instead of failing it.
pub async fn ask_head<T, F, Fut>(
    endpoint: &Endpoint,
    head: SocketAddr,
    again: bool,
    ask: F,
) -> Result<T, ClientError>
where
    F: Fn(Connection) -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let end = tokio::time::Instant::now() + head_wait();
    let mut backoff = HEAD_RETRY_FIRST;
    loop {
        let answer = match endpoint.connect(head, None).await {
            Ok(connection) => ask(connection).await,
            Err(e) => Err(e.into()),
        };
        match answer {
            Err(e) if again && e.is_unreachable() => {
                if tokio::time::Instant::now() + backoff > end {
                    return Err(e);
                }
                // The connection is closed (the next ask dials anew): a
                // slow head's requests time out instead, and are not asked
                // again here, so no connection others use is cut.
                tracing::debug!("the head is unreachable ({e}); asking again in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(HEAD_RETRY_MAX);
            }
            answer => return answer,
        }
    }
}

/// A client of a cluster's head, for status, events and probes. Requests
/// that only read ride a head restart out ([`ask_head`]).
pub struct ClusterClient {
    endpoint: Endpoint,
    head: SocketAddr,
}

impl ClusterClient {
    /// Connects to the head at `address` with default transport settings.
    pub async fn connect(address: &str, token: &JoinToken) -> Result<Self, ClientError> {
        Self::connect_with(address, token, TransportConfig::default()).await
    }

    /// Connects to the head at `address`.
    pub async fn connect_with(
        address: &str,
        token: &JoinToken,
        config: TransportConfig,
    ) -> Result<Self, ClientError> {
        let head = resolve(address)?;
        let name = format!("client-{}", std::process::id());
        let me = PeerIdentity {
            role: PeerRole::Client,
            identity: NodeIdentity {
                name: name.clone(),
                incarnation: Incarnation::fresh(),
            },
        };
        let credentials = Credentials::issue(token, &name)?;
        let endpoint = Endpoint::client(me, &credentials, config)?;
        endpoint.connect(head, None).await?;
        Ok(ClusterClient { endpoint, head })
    }

    /// A connection to the head (the live one, or a new one).
    pub async fn head(&self) -> Result<Connection, ClientError> {
        Ok(self.endpoint.connect(self.head, None).await?)
    }

    /// This client's endpoint, to dial other nodes.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Sends a request of a subsystem to the head ([`ask_head`]) and
    /// returns its reply.
    pub async fn call<R: Subsystem>(&self, request: R) -> Result<R::Reply, ClientError> {
        let request: ControlRequest = request.into();
        let request = &request;
        let ask = |head: Connection| async move {
            exchange(&head, request, RequestOptions::control()).await
        };
        let reply = ask_head(&self.endpoint, self.head, request.is_idempotent(), ask).await?;
        Ok(R::expect(reply)?)
    }

    /// The membership and resource view.
    pub async fn status(&self) -> Result<ClusterStatus, ClientError> {
        match self.call(MembershipRequest::Status).await? {
            MembershipReply::Status(status) => Ok(status),
            reply => Err(UnexpectedReply::new("Status", reply).into()),
        }
    }

    /// Asks the head to rotate its ticket key (`crate::transport`'s
    /// `ticket_keys.rs`): when the new key signs and when the old one
    /// stops being accepted, in seconds since the Unix epoch.
    pub async fn rotate_ticket_key(&self) -> Result<(u64, u64), ClientError> {
        match self.call(MembershipRequest::RotateTicketKey).await? {
            MembershipReply::TicketKeyRotating { switch_at, done_at } => Ok((switch_at, done_at)),
            reply => Err(UnexpectedReply::new("RotateTicketKey", reply).into()),
        }
    }

    /// Events after sequence number `after`, waiting up to `wait` for one.
    pub async fn events(
        &self,
        after: u64,
        wait: Duration,
    ) -> Result<Vec<ClusterEvent>, ClientError> {
        let ask = |head: Connection| async move { events(&head, after, wait).await };
        ask_head(&self.endpoint, self.head, true, ask).await
    }

    /// The number of the latest cluster event (before the first, the number
    /// this start of the head counts from), to
    /// read only later events with [`events`](Self::events).
    pub async fn last_event_seq(&self) -> Result<u64, ClientError> {
        let ask = |head: Connection| async move { last_event_seq(&head).await };
        ask_head(&self.endpoint, self.head, true, ask).await
    }

    /// Waits until the status satisfies `done`, re-reading it whenever a
    /// cluster event arrives, for at most `deadline`.
    pub async fn wait_for_status(
        &self,
        what: &str,
        deadline: Duration,
        mut done: impl FnMut(&ClusterStatus) -> bool,
    ) -> Result<ClusterStatus, ClientError> {
        let end = Instant::now() + deadline;
        let mut seen = self.last_event_seq().await?;
        loop {
            let status = self.status().await?;
            if done(&status) {
                return Ok(status);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Deadline {
                    what: what.to_string(),
                    after: deadline,
                });
            }
            if let Some(last) = self.events(seen, left).await?.last() {
                seen = last.seq;
            }
        }
    }

    /// A connection to `node`, which must still be the incarnation
    /// `node` describes.
    pub async fn connect_node(&self, node: &NodeStatus) -> Result<Connection, ClientError> {
        Ok(self
            .endpoint
            .connect(node.address, Some(&node.identity()))
            .await?)
    }

    /// What `node`'s object store holds.
    pub async fn objects(&self, node: &NodeStatus) -> Result<ObjectListing, ClientError> {
        list_objects(&self.connect_node(node).await?).await
    }

    /// Round trip of `payload` to `node`.
    pub async fn echo(
        &self,
        node: &Connection,
        payload: Vec<u8>,
        options: RequestOptions,
    ) -> Result<Vec<u8>, ClientError> {
        Ok(call(node, Echo(payload), options).await?.0)
    }
}
