//! A node's `/metrics` endpoint: its own metrics and its processes'
//! pushes, summed (`merge.rs`), on a thread and a runtime of their own
//! (`http.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::http::HttpThread;
use super::ProcessMetrics;

/// What can stop the metrics endpoint from starting.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address is taken or not this machine's.
    #[error("cannot serve /metrics on {address}: {source}; choose another --metrics-export-port")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Its thread or runtime could not start.
    #[error("cannot start the metrics endpoint's thread: {0}")]
    Thread(std::io::Error),
}

/// A running `/metrics` endpoint; dropping it stops it.
pub struct MetricsServer {
    address: SocketAddr,
    _server: HttpThread,
}

impl MetricsServer {
    /// Serves `GET /metrics` on `address`: this process's metrics (after
    /// `before_scrape` set its gauges) and the pushes kept in `processes`.
    pub fn start(
        address: SocketAddr,
        processes: Arc<Mutex<ProcessMetrics>>,
        before_scrape: impl Fn() + Send + Sync + 'static,
    ) -> Result<Self, MetricsError> {
        let before_scrape = Arc::new(before_scrape);
        let bind = |source| MetricsError::Bind { address, source };
        let listener = std::net::TcpListener::bind(address).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let bound = listener.local_addr().map_err(bind)?;
        super::install();
        let app = Router::new().route(
            "/metrics",
            get(move || {
                let processes = processes.clone();
                let before_scrape = before_scrape.clone();
                async move {
                    before_scrape();
                    let own = super::render();
                    let mut text = String::new();
                    match processes.lock() {
                        Ok(mut processes) => processes.render(&own, Instant::now(), &mut text),
                        Err(_) => text = own,
                    }
                    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
                }
            }),
        );
        let server = HttpThread::spawn("metrics", listener, app, None, std::future::pending())
            .map_err(MetricsError::Thread)?;
        Ok(MetricsServer {
            address: bound,
            _server: server,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}
