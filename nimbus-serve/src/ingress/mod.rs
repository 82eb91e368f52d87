//! `Ingress`: the HTTP front door, one actor per node (as Ray Serve's
//! proxies), serving the routes of the deployed applications.
//!
//! 1. **Listen** ([`Listen`]): an HTTP/1 server (axum on hyper) on a
//!    multi-threaded runtime of its own ([`INGRESS_THREADS`] threads) in
//!    the ingress's worker process, bound with `SO_REUSEPORT` so ingresses
//!    of nodes that share a host (a local cluster) share the port.
//! 2. **Routes** ([`SetRoutes`]): the controller publishes the route table
//!    after every change and every health round; `router.rs` decides.
//! 3. **A request**: its path picks the route (404 if none); its body
//!    (up to `max_body_bytes`, else 413) goes to a replica picked by two
//!    choices, as a [`Request`]; the replica's answer is the response. A
//!    replica that is full, or that the call never reached, is replaced by
//!    another pick; a replica that fails the call is held down and the
//!    request answered 503 with `Retry-After`, as are requests refused for
//!    overload. A request not answered within `request_timeout` gets 504.
//! 4. **Cancel**: a request dropped while its replica runs it (its client
//!    closed the connection, or `request_timeout` passed) sends the
//!    replica a [`Cancel`] with the request's id, so its work stops too.

mod router;

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use nimbus::actor::{ActorHandle, CallError};
use nimbus::cluster::ActorId;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Notify};

use crate::replica::{Answer, Cancel, Replica, Request};
pub(crate) use router::RouteSpec;
pub use router::DOWN_HOLD;
use router::{Pick, Router};

/// Threads of each ingress's HTTP runtime.
pub const INGRESS_THREADS: usize = 2;
/// `Retry-After` (seconds) of a 503.
pub const RETRY_AFTER_S: u64 = 1;
/// Picks one request may make before it is answered 503: replicas that
/// were full or that the call never reached.
const MAX_PICKS: u32 = 16;

/// Serves HTTP on its node.
pub struct Ingress {
    args: IngressArgs,
    /// Where it listens, once it does.
    address: Option<SocketAddr>,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
}

impl Actor for Ingress {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Context<Self>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What an ingress is built from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IngressArgs {
    pub(crate) node: String,
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) max_body_bytes: usize,
    pub(crate) request_timeout: Duration,
}

impl Ingress {
    fn new(args: IngressArgs) -> Self {
        let shared = Arc::new(Shared {
            router: Mutex::new(Router::new()),
            changed: Notify::new(),
            request_timeout: args.request_timeout,
        });
        Ingress {
            args,
            address: None,
            shared,
            stop: None,
        }
    }
}

nimbus::remote_actor!(Ingress, args: IngressArgs, new: Ingress::new, handles: [Listen, SetRoutes]);

/// Starts the HTTP server (once: asked again, answers the same); answers
/// the address it listens on.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<SocketAddr, String>")]
pub struct Listen;

nimbus::remote_message!(Listen);

impl Handler<Listen> for Ingress {
    type Result = ResponseActFuture<Self, Result<SocketAddr, String>>;

    fn handle(&mut self, _: Listen, _: &mut Context<Self>) -> Self::Result {
        if let Some(address) = self.address {
            return Box::pin(fut::ready(Ok(address)));
        }
        let (bound_tx, bound_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        self.stop = Some(stop_tx);
        let (args, shared) = (self.args.clone(), self.shared.clone());
        let started = std::thread::Builder::new()
            .name("nimbus-serve-http".into())
            .spawn(move || serve_http(args, shared, bound_tx, stop_rx));
        let bound = async move {
            started.map_err(|e| format!("cannot start the HTTP thread: {e}"))?;
            bound_rx
                .await
                .map_err(|_| "the HTTP thread ended before listening".to_string())?
        };
        Box::pin(bound.into_actor(self).map(|bound, ingress, _| {
            if let Ok(address) = bound {
                ingress.address = Some(address);
            }
            bound
        }))
    }
}

/// Replaces the route table; answers the requests waiting in each
/// deployment's queue here (`router.rs`, step 3).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Vec<(String, u32)>")]
pub struct SetRoutes(pub(crate) Vec<RouteWire>);

nimbus::remote_message!(SetRoutes);

/// One route as the controller sends it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RouteWire {
    pub(crate) prefix: String,
    pub(crate) deployment: String,
    pub(crate) max_ongoing: u32,
    pub(crate) max_queued: u32,
    pub(crate) replicas: Vec<(ActorHandle<Replica>, bool)>,
}

impl Handler<SetRoutes> for Ingress {
    type Result = MessageResult<SetRoutes>;

    fn handle(&mut self, routes: SetRoutes, _: &mut Context<Self>) -> Self::Result {
        let specs = routes
            .0
            .into_iter()
            .map(|route| RouteSpec {
                prefix: route.prefix,
                deployment: route.deployment,
                max_ongoing: route.max_ongoing,
                max_queued: route.max_queued,
                replicas: route
                    .replicas
                    .into_iter()
                    .map(|(handle, up)| (handle.id(), handle, up))
                    .collect(),
            })
            .collect();
        let waiting = {
            let mut router = lock(&self.shared);
            router.set(specs);
            router.waiting()
        };
        self.shared.changed.notify_waiters();
        MessageResult(waiting)
    }
}

/// What the HTTP handlers share with the actor.
struct Shared {
    router: Mutex<Router<ActorHandle<Replica>>>,
    /// Notified when a request ends or the routes change: queued requests
    /// pick again.
    changed: Notify,
    request_timeout: Duration,
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Router<ActorHandle<Replica>>> {
    // A handler that panicked while holding the router left it whole:
    // every change is one call.
    shared
        .router
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The HTTP thread: binds, reports, serves until told to stop.
fn serve_http(
    args: IngressArgs,
    shared: Arc<Shared>,
    bound: oneshot::Sender<Result<SocketAddr, String>>,
    stop: oneshot::Receiver<()>,
) {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(INGRESS_THREADS)
        .thread_name("nimbus-serve-http")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = bound.send(Err(format!("cannot start the HTTP runtime: {e}")));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match bind(&args.host, args.port) {
            Ok(listener) => listener,
            Err(e) => {
                let _ = bound.send(Err(e));
                return;
            }
        };
        let address = listener.local_addr().map_err(|e| e.to_string());
        let _ = bound.send(address);
        let app = axum::Router::new()
            .fallback(handle_request)
            .layer(DefaultBodyLimit::max(args.max_body_bytes))
            .with_state(shared);
        let stopped = async {
            let _ = stop.await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(node = %args.node, "the HTTP ingress stopped: {e}");
        }
    });
}

fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, String> {
    let address: SocketAddr = format!("{host}:{port}")
        .parse()
        .map_err(|e| format!("{host}:{port} is not an address: {e}"))?;
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| e.to_string())?;
    socket.set_reuseport(true).map_err(|e| e.to_string())?;
    socket.set_reuseaddr(true).map_err(|e| e.to_string())?;
    socket.bind(address).map_err(|e| e.to_string())?;
    socket.listen(1024).map_err(|e| e.to_string())
}

async fn handle_request(State(shared): State<Arc<Shared>>, uri: Uri, body: Bytes) -> Response {
    let path = uri.path();
    let prefix = lock(&shared).route_of(path).map(str::to_string);
    let Some(prefix) = prefix else {
        return json_error(
            StatusCode::NOT_FOUND,
            &format!("no application serves {path}"),
        );
    };
    let timeout = shared.request_timeout;
    match tokio::time::timeout(timeout, route(&shared, &prefix, body)).await {
        Ok(response) => response,
        Err(_) => json_error(
            StatusCode::GATEWAY_TIMEOUT,
            &format!("no answer within {timeout:?} (HttpOptions::request_timeout)"),
        ),
    }
}

/// Picks replicas until one answers, the route refuses, or a call fails.
async fn route(shared: &Shared, prefix: &str, body: Bytes) -> Response {
    let mut seat = QueueSeat {
        shared,
        prefix,
        held: false,
    };
    // Only sends count: a request waits in the queue through any number
    // of wake-ups (until `request_timeout`).
    let mut picks = 0;
    while picks < MAX_PICKS {
        let mut changed = pin!(shared.changed.notified());
        changed.as_mut().enable();
        let draw = (rand::random(), rand::random());
        let pick = lock(shared).pick(prefix, seat.held, draw, Instant::now());
        let (replica, handle) = match pick {
            Pick::Send { replica, handle } => {
                seat.held = false;
                picks += 1;
                (replica, handle)
            }
            Pick::Wait => {
                seat.held = true;
                changed.await;
                continue;
            }
            Pick::Overloaded { deployment } => {
                return unavailable(&format!(
                    "{deployment} is overloaded: every replica has max_ongoing_requests and max_queued_requests wait"
                ))
            }
            Pick::NoReplica { deployment } => {
                return unavailable(&format!("{deployment} has no replica up"))
            }
            Pick::NotFound => {
                return json_error(StatusCode::NOT_FOUND, &format!("{prefix} is no longer served"))
            }
        };
        let id = rand::random();
        let call = handle.send(Request {
            id,
            body: body.to_vec(),
        });
        let running = CancelOnDrop {
            shared,
            replica,
            handle: Some(handle),
            id,
        };
        let answered = call.await;
        running.answered();
        match answered {
            Ok(Answer::Done {
                status,
                body,
                ongoing,
            }) => {
                end(shared, replica, Some(ongoing));
                let status =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                return json(status, body);
            }
            Ok(Answer::Full { ongoing }) => end(shared, replica, Some(ongoing)),
            Err(e) if never_reached(&e) => {
                fail(shared, replica);
                tracing::debug!(%replica, "a call did not reach its replica: {e}");
            }
            Err(e) => {
                fail(shared, replica);
                return unavailable(&format!("replica {replica} failed the request: {e}"));
            }
        }
    }
    unavailable(&format!(
        "no replica of {prefix} took the request after {MAX_PICKS} picks"
    ))
}

/// A place in a route's queue, given back if the request is dropped
/// (timed out, or its client left) while waiting.
struct QueueSeat<'a> {
    shared: &'a Shared,
    prefix: &'a str,
    held: bool,
}

impl Drop for QueueSeat<'_> {
    fn drop(&mut self) {
        if self.held {
            lock(self.shared).leave_queue(self.prefix);
        }
    }
}

/// A request on its way to or running on a replica: dropped before its
/// answer came, it ends there for the router (which counted it as
/// ongoing) and is cancelled on the replica.
struct CancelOnDrop<'a> {
    shared: &'a Shared,
    replica: ActorId,
    handle: Option<ActorHandle<Replica>>,
    id: u64,
}

impl CancelOnDrop<'_> {
    /// The call came back (answered or failed): nothing to cancel.
    fn answered(mut self) {
        self.handle = None;
    }
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        end(self.shared, self.replica, None);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let id = self.id;
        runtime.spawn(async move {
            if let Err(e) = handle.send(Cancel { id }).await {
                tracing::debug!("a cancel did not reach its replica: {e}");
            }
        });
    }
}

fn end(shared: &Shared, replica: ActorId, ongoing: Option<u32>) {
    lock(shared).finished(replica, ongoing);
    shared.changed.notify_waiters();
}

fn fail(shared: &Shared, replica: ActorId) {
    lock(shared).failed(replica, Instant::now());
    shared.changed.notify_waiters();
}

/// Whether a failed call certainly did not run on the replica.
fn never_reached(e: &CallError) -> bool {
    matches!(
        e,
        CallError::MailboxFull { .. } | CallError::Cluster(_) | CallError::NotInitialized
    )
}

fn json(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = (status, body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn json_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message })
        .to_string()
        .into_bytes();
    json(status, body)
}

fn unavailable(message: &str) -> Response {
    let mut response = json_error(StatusCode::SERVICE_UNAVAILABLE, message);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    response
}
