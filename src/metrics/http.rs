//! An HTTP server on a thread and a runtime of its own, so that its
//! requests never queue behind the actors' work and its stop waits on
//! nothing of theirs: the `/metrics` endpoint and the dashboard.
//!
//! 1. The caller binds the socket first (a taken port fails its start at
//!    once, naming its own flag).
//! 2. [`HttpThread::spawn`] builds a current-thread runtime, starts the
//!    thread, and serves the router there, beside one background task.
//! 3. Dropping the [`HttpThread`] stops serving and the background task,
//!    gives open requests [`STOP_GRACE`], and joins the thread.

use std::future::Future;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::Router;
use tokio::sync::oneshot;

/// How long a stopping server waits for the requests under way.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// A running server; dropping it stops it.
pub struct HttpThread {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HttpThread {
    /// Serves `app` on `listener` (bound, non-blocking) on a thread named
    /// `name`, and runs `background` beside it until the server stops.
    /// Fails only when the thread or its runtime cannot start.
    pub fn spawn(
        name: &'static str,
        listener: std::net::TcpListener,
        app: Router,
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
                        served = axum::serve(listener, app) => {
                            if let Err(e) = served {
                                tracing::error!("{name}: stopped serving: {e}");
                            }
                        }
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
