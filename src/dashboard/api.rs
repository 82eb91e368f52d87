//! The dashboard's HTTP routes: the page and its assets, the login, and
//! the JSON API under `/api/…` that the page uses and scripts may use
//! (documented in the module docs of [`crate::dashboard`]).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::client::{ClientError, LogChunk};

use super::auth::{self, Sessions};
use super::views::{self, Views};

/// The page, its script and its style, compiled into the binary.
const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");
const LOGIN_HTML: &str = include_str!("page/login.html");
/// The most bytes of a log one request returns.
const MAX_LOG_CHUNK: u64 = 256 << 10;
/// A live page hears of a change at least this often (resource use
/// changes without cluster events).
pub const TICK: Duration = Duration::from_secs(2);

/// What every request handler shares.
pub(crate) struct Shared {
    /// The cluster's state, cached.
    pub views: Views,
    /// Sessions: opened with the dashboard credential beyond loopback,
    /// with the dashboard's secret on loopback.
    pub sessions: Mutex<Sessions>,
    /// The `Host` headers accepted on a loopback dashboard (a page of
    /// another site that resolves its name to 127.0.0.1 cannot read it).
    pub loopback_hosts: Vec<String>,
    /// Bumped on every cluster event and every [`TICK`] while a page
    /// listens.
    pub changes: watch::Sender<u64>,
    /// It serves HTTPS: its cookie is `Secure`.
    pub secure: bool,
}

/// The routes.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(|| asset("text/javascript", APP_JS)))
        .route("/style.css", get(|| asset("text/css", STYLE_CSS)))
        .route("/login", post(login))
        .route("/logout", post(logout))
        .route("/api/cluster", get(cluster))
        .route("/api/events", get(events))
        .route("/api/jobs/{id}/log", get(job_log))
        .route("/api/actors/{id}/log", get(actor_log))
        .route("/api/runs/{id}", get(run))
        .route("/api/timeline", get(timeline))
        .route("/api/activity", get(activity))
        .route("/api/{listing}", get(listing))
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

/// Refuses requests for another host name on a loopback dashboard, and
/// there requests with neither its secret nor a session (steps 2 and 3 of
/// the module docs); on one bound beyond loopback, requests without a
/// session (the page itself then shows the login form).
async fn guard(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    if !shared.loopback_hosts.is_empty() {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !shared.loopback_hosts.iter().any(|allowed| allowed == host) {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "this dashboard answers to {} only",
                    shared.loopback_hosts.join(", ")
                ),
            );
        }
        if signed_in(&shared, headers) {
            return next.run(request).await;
        }
        if !presents_secret(&shared, &request) {
            return error(
                StatusCode::UNAUTHORIZED,
                "open the URL with ?secret=... that `nimbus start` printed (also in $NIMBUS_HOME/dashboard-url): this dashboard answers only to it".into(),
            );
        }
        // The page opened with the secret: a session for its own requests.
        let opens_page = request.uri().path() == "/";
        let mut response = next.run(request).await;
        if opens_page {
            if let Some(cookie) = open_session(&shared) {
                response.headers_mut().insert(header::SET_COOKIE, cookie);
            }
        }
        return response;
    }
    let path = request.uri().path();
    if path == "/login" || path == "/style.css" || signed_in(&shared, headers) {
        return next.run(request).await;
    }
    if path == "/" {
        return html(StatusCode::OK, LOGIN_HTML.replace("{error}", ""));
    }
    error(
        StatusCode::UNAUTHORIZED,
        "sign in first: this dashboard is reachable beyond this machine and asks for its credential (the dashboard-credential: line of nimbus start; $NIMBUS_HOME/dashboard-credential on the head)".into(),
    )
}

fn signed_in(shared: &Shared, headers: &HeaderMap) -> bool {
    let id = headers
        .get(header::COOKIE)
        .and_then(|h| h.to_str().ok())
        .and_then(|cookies| auth::cookie(cookies, auth::COOKIE));
    match (id, shared.sessions.lock()) {
        (Some(id), Ok(sessions)) => sessions.check(id, Instant::now()),
        _ => false,
    }
}

/// Whether a request to a loopback dashboard carries its secret: the
/// query's `secret`, or `Authorization: Bearer SECRET`.
fn presents_secret(shared: &Shared, request: &Request) -> bool {
    let from_query = request.uri().query().and_then(|query| {
        query
            .split('&')
            .find_map(|pair| pair.strip_prefix("secret="))
    });
    let from_header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let Ok(sessions) = shared.sessions.lock() else {
        return false;
    };
    [from_query, from_header]
        .into_iter()
        .flatten()
        .any(|presented| sessions.is_key(presented))
}

/// A new session's cookie (`HttpOnly`, `SameSite=Strict`; `Secure` over
/// HTTPS), if the table can be read.
fn open_session(shared: &Shared) -> Option<HeaderValue> {
    let id = shared.sessions.lock().ok()?.open(Instant::now());
    session_cookie(&id, shared.secure)
}

fn session_cookie(id: &str, secure: bool) -> Option<HeaderValue> {
    let cookie = format!(
        "{}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
        auth::COOKIE,
        auth::SESSION_TTL.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    HeaderValue::from_str(&cookie).ok()
}

async fn index() -> Response {
    html(StatusCode::OK, INDEX_HTML.to_string())
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn error(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// The login form's fields.
#[derive(Deserialize)]
struct LoginForm {
    credential: String,
}

async fn login(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    Form(form): Form<LoginForm>,
) -> Response {
    let session = match shared.sessions.lock() {
        Ok(mut sessions) => sessions.login(&form.credential, Instant::now()),
        Err(_) => None,
    };
    let Some(id) = session else {
        tracing::warn!("dashboard: a sign-in from {peer} with a wrong credential was refused");
        return html(
            StatusCode::UNAUTHORIZED,
            LOGIN_HTML.replace(
                "{error}",
                "<p class=\"error\">That is not this dashboard's credential.</p>",
            ),
        );
    };
    let mut response = Redirect::to("/").into_response();
    if let Some(cookie) = session_cookie(&id, shared.secure) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

async fn logout(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let id = headers
        .get(header::COOKIE)
        .and_then(|h| h.to_str().ok())
        .and_then(|cookies| auth::cookie(cookies, auth::COOKIE));
    if let (Ok(mut sessions), Some(id)) = (shared.sessions.lock(), id) {
        sessions.logout(id);
    }
    Redirect::to("/").into_response()
}

/// Paging and filtering of a listing.
#[derive(Deserialize)]
struct PageQuery {
    #[serde(default)]
    offset: usize,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    q: String,
}

async fn listing(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    Query(query): Query<PageQuery>,
) -> Response {
    let Some(what) = views::listing(&name) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("no listing {name:?}: actors, nodes, objects, jobs, placement-groups, tasks or runs"),
        );
    };
    match shared.views.rows(what).await {
        Ok(rows) => Json(views::page(
            &rows,
            &query.q,
            query.offset,
            query.limit.unwrap_or(views::DEFAULT_PAGE),
        ))
        .into_response(),
        Err(e) => cluster_error(e),
    }
}

fn cluster_error(e: ClientError) -> Response {
    let status = match e {
        ClientError::NotFound { .. } => StatusCode::NOT_FOUND,
        _ => StatusCode::BAD_GATEWAY,
    };
    error(status, format!("asking the cluster: {e}"))
}

async fn cluster(State(shared): State<Arc<Shared>>) -> Response {
    match shared.views.cluster().await {
        Ok(value) => Json(value).into_response(),
        Err(e) => cluster_error(e),
    }
}

async fn activity(State(shared): State<Arc<Shared>>) -> Response {
    Json(shared.views.activity().await).into_response()
}

async fn timeline(State(shared): State<Arc<Shared>>) -> Response {
    match shared.views.timeline().await {
        Ok(events) => Json(events).into_response(),
        Err(e) => cluster_error(e),
    }
}

async fn run(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match shared
        .views
        .with_client(async |client| client.run(&id).await)
        .await
    {
        Ok(run) => Json(run).into_response(),
        Err(e) => cluster_error(e),
    }
}

/// Where a log read starts.
#[derive(Deserialize)]
struct LogQuery {
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    stderr: bool,
}

async fn job_log(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> Response {
    let read = shared
        .views
        .with_client(async |client| {
            let job = client.job(&id).await?;
            let chunk = client
                .read_job_log(&job, query.offset, MAX_LOG_CHUNK)
                .await?;
            Ok((Value::Object(crate::client::job_row(&job)), chunk))
        })
        .await;
    log_response(query.offset, read)
}

async fn actor_log(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    Query(query): Query<LogQuery>,
) -> Response {
    let read = shared
        .views
        .with_client(async |client| {
            let actor = client
                .find_actor(&id)
                .await?
                .ok_or_else(|| ClientError::NotFound {
                    what: format!("actor {id}"),
                })?;
            let chunk = client
                .read_log(&actor, query.stderr, query.offset, MAX_LOG_CHUNK)
                .await?;
            Ok((json!({ "id": actor.actor.to_string() }), chunk))
        })
        .await;
    log_response(query.offset, read)
}

/// A log chunk read from `offset`, with what it is the log of, as JSON
/// (see [`log_json`]), or the error that stopped its reading.
fn log_response(offset: u64, read: Result<(Value, LogChunk), ClientError>) -> Response {
    match read {
        Ok((about, chunk)) => Json(log_json(offset, chunk, about)).into_response(),
        Err(e) => cluster_error(e),
    }
}

/// A log chunk as JSON: its text up to the last complete character, and
/// the offset to read on from.
fn log_json(offset: u64, chunk: LogChunk, about: Value) -> Value {
    let complete = match std::str::from_utf8(&chunk.bytes) {
        Ok(text) => text.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => chunk.bytes.len(),
    };
    let text = String::from_utf8_lossy(&chunk.bytes[..complete]);
    json!({
        "file": chunk.file,
        "total": chunk.total,
        "offset": offset,
        "next": offset + complete as u64,
        "text": text,
        "about": about,
    })
}

/// Server-sent events: `change` whenever the cluster changed (and at
/// least every [`TICK`]); the page then reloads what it shows.
async fn events(
    State(shared): State<Arc<Shared>>,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let receiver = shared.changes.subscribe();
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.changed().await.ok()?;
        let version = *receiver.borrow_and_update();
        let event = Event::default().event("change").data(version.to_string());
        Some((Ok(event), receiver))
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_chunk_ends_at_a_complete_character() {
        let chunk = LogChunk {
            file: "job.log".into(),
            total: 9,
            bytes: "ab\u{e9}c\u{20ac}".as_bytes()[..7].to_vec(),
        };
        let json = log_json(10, chunk, Value::Null);
        assert_eq!(json["text"], "ab\u{e9}c");
        assert_eq!(json["next"], 15);
    }
}
