//! The dashboard: a web page of the cluster served by the head
//! (`nimbus start --head`, port [`DEFAULT_PORT`] unless
//! `--dashboard-port`), with nothing to install: the page and its assets
//! are compiled into the binary.
//!
//! It is a client of the cluster like the CLI: it asks the head (and the
//! nodes, for objects, bundles and logs) over QUIC with the cluster's
//! token, from a thread and a runtime of its own, so the control plane's
//! actors never wait on it. What it costs the control plane is bounded:
//! each listing is read at most once per [`REFRESH`] whatever the number
//! of open pages, and the event long poll runs only while a page listens.
//!
//! # Protocol
//!
//! 1. [`DashboardListener::bind`] binds `--dashboard-host:--dashboard-port`
//!    (127.0.0.1:8265 by default: private to this machine) before it
//!    returns, so a taken port is an error at start, not later.
//! 2. Bound to loopback, it answers requests whose `Host` is that
//!    loopback address only (a page of another site cannot read it by
//!    renaming itself to 127.0.0.1), and only with its secret: 32 random
//!    bytes made at its start, in the URL it prints
//!    (`http://127.0.0.1:PORT/?secret=...`, which `nimbus start` also
//!    keeps in the 0600 file `$NIMBUS_HOME/dashboard-url`), as notebook
//!    servers do: other users of the machine can reach the port but not
//!    read the file. A request with `?secret=` (or `Authorization: Bearer
//!    SECRET`, for scripts) passes, and the page's own request opens a
//!    session (the cookie of step 3) for the requests of the page;
//!    without either, every route answers 401.
//! 3. Bound beyond loopback, it serves HTTPS only (`tls.rs`: the user's
//!    certificate, else a self-signed one kept under `$NIMBUS_HOME`; a
//!    bind beyond loopback without TLS is refused), and every request but
//!    the login needs a session: `POST /login` with the form field
//!    `credential` (never in a URL) opens one for [`SESSION_TTL`] and sets
//!    the `HttpOnly`, `SameSite=Strict`, `Secure` cookie `nimbus_session`;
//!    without it `/` shows the login form and `/api/…` answers 401.
//!    `POST /logout` ends it. The credential is the dashboard's own, not
//!    the cluster token ([`JoinToken::dashboard_credential`]): the
//!    dashboard only reads, so one who learns it can look, not act. A
//!    wrong one is logged as refused, with the address it came from, what
//!    was presented never. (A dashboard on loopback given a certificate
//!    serves HTTPS too.)
//! 4. The page loads what it shows from the JSON API and listens to
//!    `/api/events`: server-sent `change` events, sent on every cluster
//!    event and at least every [`TICK`], after which it reloads its view.
//!
//! # JSON API
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/cluster` | `nodes` (as `nimbus status --json`, each alive one with `object_store`: used, capacity, spilled, objects) and `pending` demands |
//! | `GET /api/{actors,nodes,objects,jobs,placement-groups,tasks,runs}?offset=&limit=&q=` | `{total, unfiltered, offset, rows}`: the rows of `nimbus list`, those with every word of `q` in some cell, `limit` (≤ [`MAX_PAGE`], default 100) from `offset` |
//! | `GET /api/jobs/{id}/log?offset=` | `{text, next, total, file, about}`: a submitted job's driver log from `offset` (≤ 256 KiB), `about` the job's row |
//! | `GET /api/actors/{id}/log?offset=&stderr=` | the same for an actor's stdout (or stderr) log, by id or name |
//! | `GET /api/runs/{id}` | a training run: `header`, `state`, `points` (its reports: index, attempt, time, metrics), `checkpoints`, `timeline` |
//! | `GET /api/activity` | samples of the head node's counters (its own and its workers' and drivers' pushes, `crate::metrics`), taken while a page listens, oldest first: `{time_ms, actor_calls, tasks_finished, put_bytes}` |
//! | `GET /api/timeline` | the cluster's last 500 events but resource changes, newest first: `{seq, time_ms, kind, text}` (node joins and deaths, actor starts and deaths, injected faults and recoveries, jobs ended) |
//! | `GET /api/events` | `text/event-stream` of `change` events |
//!
//! Errors are `{"error": "…"}` with 401 (no session), 403 (wrong host),
//! 404 (no such listing, job or actor) or 502 (the cluster did not
//! answer).

mod api;
mod auth;
mod tls;
mod views;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::metrics::HttpThread;
use crate::transport::JoinToken;

pub use api::TICK;
pub use auth::SESSION_TTL;
pub use tls::{DashboardTls, TlsSource, SELF_SIGNED_DIR};
pub use views::{MAX_PAGE, REFRESH};

/// The dashboard's port unless told otherwise (as Ray's).
pub const DEFAULT_PORT: u16 = 8265;
/// How often the event watcher checks for a listening page while none
/// listens (a local check; the head is not asked).
const IDLE_CHECK: Duration = Duration::from_millis(500);

/// Where the dashboard listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DashboardConfig {
    /// The address to bind (`--dashboard-host`, 127.0.0.1 by default).
    pub host: IpAddr,
    /// The port (`--dashboard-port`, [`DEFAULT_PORT`] by default; 0: any
    /// free port).
    pub port: u16,
    /// Its certificate: required beyond loopback (step 3).
    pub tls: Option<TlsSource>,
}

impl Default for DashboardConfig {
    fn default() -> Self {
        DashboardConfig {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: DEFAULT_PORT,
            tls: None,
        }
    }
}

/// What can stop the dashboard from starting.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    /// The address is taken or not this machine's.
    #[error("cannot serve the dashboard on {address}: {source}; choose another with --dashboard-port (0: any free port) or --dashboard-host, or go without it with --no-dashboard")]
    Bind {
        /// The address asked for.
        address: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Its thread or runtime could not start.
    #[error("cannot start the dashboard's thread: {0}")]
    Thread(std::io::Error),
    /// Bound beyond loopback without a certificate (step 3).
    #[error("the dashboard at {0} would be reachable beyond this machine over cleartext HTTP: give it a certificate (nimbus start makes a self-signed one unless given --dashboard-tls-cert and --dashboard-tls-key), or bind it to loopback (--dashboard-host 127.0.0.1)")]
    NoTls(IpAddr),
    /// The certificate or key cannot be read, made or used.
    #[error("the dashboard's certificate {path}: {detail}; give --dashboard-tls-cert and --dashboard-tls-key as PEM files (a chain, leaf first, and its key), or remove {path} to have a new self-signed one made")]
    Tls {
        /// The file or directory.
        path: std::path::PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// A running dashboard; dropping it stops it (open pages lose their
/// connection).
pub struct Dashboard {
    address: SocketAddr,
    login: bool,
    /// Its certificate's SHA-256 fingerprint, when it serves HTTPS.
    fingerprint: Option<String>,
    /// The secret of a loopback dashboard (step 2).
    secret: Option<String>,
    _server: HttpThread,
}

/// The dashboard's socket, bound but not serving yet: binding comes
/// first so that a taken port fails the start of the head at once.
pub struct DashboardListener {
    listener: std::net::TcpListener,
    address: SocketAddr,
    tls: Option<DashboardTls>,
}

impl DashboardListener {
    /// Loads `config`'s certificate (refusing none beyond loopback) and
    /// binds its address.
    pub fn bind(config: DashboardConfig) -> Result<Self, DashboardError> {
        let tls = match (&config.tls, config.host.is_loopback()) {
            (Some(source), _) => Some(DashboardTls::load(source)?),
            (None, true) => None,
            (None, false) => return Err(DashboardError::NoTls(config.host)),
        };
        let wanted = SocketAddr::new(config.host, config.port);
        let bind = |source| DashboardError::Bind {
            address: wanted,
            source,
        };
        let listener = std::net::TcpListener::bind(wanted).map_err(bind)?;
        listener.set_nonblocking(true).map_err(bind)?;
        let address = listener.local_addr().map_err(bind)?;
        Ok(DashboardListener {
            listener,
            address,
            tls,
        })
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves the dashboard of the cluster whose head is at `head`,
    /// asking it with `token`.
    pub fn serve(self, head: SocketAddr, token: &JoinToken) -> Result<Dashboard, DashboardError> {
        let DashboardListener {
            listener,
            address,
            tls,
        } = self;
        let login = !address.ip().is_loopback();
        let loopback_hosts = if login {
            Vec::new()
        } else {
            let port = address.port();
            let ip = match address.ip() {
                IpAddr::V6(ip) => format!("[{ip}]"),
                IpAddr::V4(ip) => ip.to_string(),
            };
            vec![format!("{ip}:{port}"), format!("localhost:{port}")]
        };
        // Beyond loopback a session opens with the dashboard credential;
        // on loopback with the dashboard's own secret.
        let secret = (!login).then(auth::new_secret);
        let key = secret
            .clone()
            .unwrap_or_else(|| token.dashboard_credential());
        let shared = Arc::new(api::Shared {
            views: views::Views::new(head, token.clone()),
            sessions: Mutex::new(auth::Sessions::new(key)),
            loopback_hosts,
            changes: watch::Sender::new(0),
            secure: tls.is_some(),
        });
        let watcher = watch_cluster(shared.clone());
        let fingerprint = tls.as_ref().map(|tls| tls.fingerprint.clone());
        let acceptor = tls.map(|tls| tls.acceptor);
        let server = HttpThread::spawn(
            "dashboard",
            listener,
            api::router(shared),
            acceptor,
            watcher,
        )
        .map_err(DashboardError::Thread)?;
        Ok(Dashboard {
            address,
            login,
            fingerprint,
            secret,
            _server: server,
        })
    }
}

impl Dashboard {
    /// Binds `config`'s address and serves the dashboard of the cluster
    /// whose head is at `head`, asking it with `token`.
    pub fn start(
        config: DashboardConfig,
        head: SocketAddr,
        token: &JoinToken,
    ) -> Result<Dashboard, DashboardError> {
        DashboardListener::bind(config)?.serve(head, token)
    }

    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The URL to open: on loopback with its secret
    /// (`http://127.0.0.1:PORT/?secret=...`; a page's route follows as
    /// `#/actors`), else its address (which asks for the credential).
    pub fn url(&self) -> String {
        match &self.secret {
            Some(secret) => format!("{}/?secret={secret}", self.base_url()),
            None => self.base_url(),
        }
    }

    /// Its address as a URL, without the secret: `http://HOST:PORT`, or
    /// `https://` when it serves HTTPS.
    pub fn base_url(&self) -> String {
        self.url_at(self.address)
    }

    /// The URL of this dashboard at `address` (where others reach it when
    /// it is bound to every address).
    pub fn url_at(&self, address: SocketAddr) -> String {
        let scheme = match self.fingerprint {
            Some(_) => "https",
            None => "http",
        };
        format!("{scheme}://{address}")
    }

    /// The SHA-256 fingerprint of its certificate (`AB:CD:...`), when it
    /// serves HTTPS.
    pub fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// The secret a loopback dashboard asks for (step 2), to send as
    /// `Authorization: Bearer SECRET`.
    pub fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    /// Whether it asks for the dashboard credential (bound beyond
    /// loopback).
    pub fn needs_login(&self) -> bool {
        self.login
    }
}

/// Bumps `shared.changes` on every cluster event and at least every
/// [`TICK`], while a page listens.
async fn watch_cluster(shared: Arc<api::Shared>) {
    let mut seen: Option<u64> = None;
    loop {
        if shared.changes.receiver_count() == 0 {
            seen = None;
            tokio::time::sleep(IDLE_CHECK).await;
            continue;
        }
        let polled = shared
            .views
            .with_client(async |client| match seen {
                None => client.last_event_seq().await,
                Some(after) => Ok(client
                    .events(after, TICK)
                    .await?
                    .last()
                    .map_or(after, |event| event.seq)),
            })
            .await;
        shared.views.sample_activity().await;
        match polled {
            Ok(seq) => seen = Some(seq),
            Err(e) => {
                tracing::debug!("dashboard: cannot read the cluster's events: {e}");
                tokio::time::sleep(TICK).await;
            }
        }
        shared.changes.send_modify(|version| *version += 1);
    }
}
