//! A node's `/metrics` endpoint: its own metrics and its processes'
//! pushes, summed (`merge.rs`), on a thread and a runtime of their own.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use super::ProcessMetrics;

/// How long a stopping server waits for a scrape under way.
const STOP_GRACE: Duration = Duration::from_secs(1);

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
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
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
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(MetricsError::Thread)?;
        let (stop, stopped) = oneshot::channel::<()>();
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
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => listener,
                        Err(e) => {
                            tracing::error!("metrics: cannot listen: {e}");
                            return;
                        }
                    };
                    tokio::select! {
                        served = axum::serve(listener, app) => {
                            if let Err(e) = served {
                                tracing::error!("metrics: stopped serving: {e}");
                            }
                        }
                        _ = stopped => {}
                    }
                });
                runtime.shutdown_timeout(STOP_GRACE);
            })
            .map_err(MetricsError::Thread)?;
        Ok(MetricsServer {
            address: bound,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
