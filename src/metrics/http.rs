//! An HTTP server on a thread and a runtime of its own, so that its
//! requests never queue behind the actors' work and its stop waits on
//! nothing of theirs: the `/metrics` endpoint and the dashboard.
//!
//! 1. The caller binds the socket first (a taken port fails its start at
//!    once, naming its own flag).
//! 2. [`HttpThread::spawn`] builds a current-thread runtime, starts the
//!    thread, and serves the router there, beside one background task.
//! 3. It holds at most [`max_connections`] connections at once (a quarter
//!    of the process's file descriptors, 16 to 1,024); more wait in the
//!    kernel's backlog until one closes. A client has
//!    [`HEADER_READ_TIMEOUT`] (10 s) to send a request's headers, on a new
//!    connection and between requests on a kept-alive one, so idle sockets
//!    cannot starve the process of descriptors (its QUIC socket, its
//!    workers' pipes, a job's files). A server given a TLS acceptor (the
//!    dashboard beyond loopback) serves HTTPS only, and a client has
//!    [`HANDSHAKE_TIMEOUT`] to finish the handshake.
//! 4. Dropping the [`HttpThread`] stops serving and the background task,
//!    gives open requests [`STOP_GRACE`], and joins the thread.

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::{oneshot, Semaphore};
use tokio_rustls::TlsAcceptor;

/// How long a stopping server waits for the requests under way.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// How long a client has to send a request's headers (step 3).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client of a TLS server has to finish the handshake (step 3).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long to wait before accepting again after an accept failed (out of
/// descriptors, say), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The most connections one server holds at once (step 3): a quarter of
/// the process's soft limit on open files, between 16 and 1,024.
pub fn max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let known = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    let files = if known { limit.rlim_cur as usize } else { 1024 };
    (files / 4).clamp(16, 1024)
}

/// Serves `app` on `listener` (over TLS when `tls`), one connection per
/// task, within step 3's bounds.
async fn serve(
    name: &'static str,
    listener: tokio::net::TcpListener,
    app: Router,
    tls: Option<TlsAcceptor>,
) {
    let permits = Arc::new(Semaphore::new(max_connections()));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("{name}: cannot accept a connection: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        // Handlers may ask who connected (`ConnectInfo`): a refused login
        // is logged with its source.
        let router = TowerToHyperService::new(app.clone());
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            hyper::service::Service::call(&router, request)
        });
        let tls = tls.clone();
        tokio::spawn(async move {
            let served = match tls {
                None => serve_connection(stream, service).await,
                Some(tls) => {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => serve_connection(stream, service).await,
                        Ok(Err(e)) => Err(format!("TLS handshake from {peer}: {e}")),
                        Err(_) => Err(format!("TLS handshake from {peer}: timed out")),
                    }
                }
            };
            if let Err(e) = served {
                tracing::debug!("{name}: a connection ended: {e}");
            }
            drop(permit);
        });
    }
}

/// Serves HTTP/1.1 on one connection, with step 3's header timeout.
async fn serve_connection<S>(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    service: S,
) -> Result<(), String>
where
    S: hyper::service::Service<Request<Incoming>, Response = axum::response::Response> + Send,
    S::Future: Send + 'static,
    S::Error: std::error::Error + Send + Sync + 'static,
{
    hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await
        .map_err(|e| e.to_string())
}

/// A running server; dropping it stops it.
pub struct HttpThread {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpThread {
    /// Serves `app` on `listener` (bound, non-blocking; over TLS when
    /// `tls`) on a thread named `name`, and runs `background` beside it
    /// until the server stops. Fails only when the thread or its runtime
    /// cannot start.
    pub fn spawn(
        name: &'static str,
        listener: std::net::TcpListener,
        app: Router,
        tls: Option<TlsAcceptor>,
        background: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            tracing::error!("{name}: cannot listen: {e}");
                            return;
                        }
                    };
                    let background = tokio::spawn(background);
                    tokio::select! {
                        () = serve(name, listener, app, tls) => {}
                        _ = stopped => {}
                    }
                    background.abort();
                });
                runtime.shutdown_timeout(STOP_GRACE);
            })?;
        Ok(HttpThread {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for HttpThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
