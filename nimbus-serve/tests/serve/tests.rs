//! The tests, and the deployment their replicas host.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus::actor::Registry;
use nimbus::cluster::ClusterEventKind;
use nimbus_serve::{
    Application, Autoscaling, ControllerError, Deployment, DeploymentHandle, HandlerError,
    HttpOptions, RegistryExt, Serve, ServeError,
};
use serde::{Deserialize, Serialize};

use crate::harness::{boxed, Test};

pub const ALL: &[(&str, Test)] = &[
    ("routes_across_replicas_and_ingresses", |d| {
        boxed(routes_across_replicas_and_ingresses(d))
    }),
    ("bad_input_gets_clear_answers", |d| {
        boxed(bad_input_gets_clear_answers(d))
    }),
    ("overload_is_refused_with_retry_after", |d| {
        boxed(overload_is_refused_with_retry_after(d))
    }),
    ("failed_constructor_fails_the_deploy", |d| {
        boxed(failed_constructor_fails_the_deploy(d))
    }),
    ("rolling_update_under_load_fails_nothing", |d| {
        boxed(rolling_update_under_load_fails_nothing(d))
    }),
    ("batching_gathers_requests_only_while_busy", |d| {
        boxed(batching_gathers_requests_only_while_busy(d))
    }),
    ("killed_replica_is_restarted_under_load", |d| {
        boxed(killed_replica_is_restarted_under_load(d))
    }),
    ("queued_requests_wait_their_turn", |d| {
        boxed(queued_requests_wait_their_turn(d))
    }),
    ("autoscaling_follows_the_load", |d| {
        boxed(autoscaling_follows_the_load(d))
    }),
    ("a_client_that_leaves_cancels_its_request", |d| {
        boxed(a_client_that_leaves_cancels_its_request(d))
    }),
    ("a_node_that_joins_later_gets_an_ingress", |d| {
        boxed(a_node_that_joins_later_gets_an_ingress(d))
    }),
    (
        "an_application_scales_to_zero_and_back_for_a_request",
        |d| boxed(an_application_scales_to_zero_and_back_for_a_request(d)),
    ),
    ("serving_rides_out_a_head_restart", |d| {
        boxed(crate::head_restart::serving_rides_out_a_head_restart(d))
    }),
    ("a_restarted_controller_takes_its_applications_back", |d| {
        boxed(a_restarted_controller_takes_its_applications_back(d))
    }),
    ("a_deployment_calls_another_through_a_handle", |d| {
        boxed(a_deployment_calls_another_through_a_handle(d))
    }),
    ("a_new_user_config_reaches_the_live_replicas", |d| {
        boxed(a_new_user_config_reaches_the_live_replicas(d))
    }),
    (
        "a_scale_up_waiting_for_room_holds_up_no_other_application",
        |d| boxed(a_scale_up_waiting_for_room_holds_up_no_other_application(d)),
    ),
];

pub fn registry() -> Registry {
    Registry::new()
        .deployment::<Probe>()
        .deployment::<Pipeline>()
}

/// Answers with its process id and its version (the init argument); sums
/// `x` (which must hold 3 numbers); panics or holds on request.
struct Probe {
    version: String,
    /// Its user config's `tag`.
    tag: std::cell::RefCell<Option<String>>,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Ask {
    x: Option<Vec<f32>>,
    panic: bool,
    hold_ms: u64,
    /// A path: the call creates `PATH.started` as it begins, and
    /// `PATH.dropped` if it is dropped before it ends (cancelled).
    marker: Option<String>,
}

/// The files of [`Ask::marker`].
struct Marker {
    path: Option<String>,
    done: bool,
}

impl Marker {
    fn start(path: Option<String>) -> Self {
        if let Some(path) = &path {
            std::fs::write(format!("{path}.started"), "").unwrap();
        }
        Marker { path, done: false }
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        if let (Some(path), false) = (&self.path, self.done) {
            std::fs::write(format!("{path}.dropped"), "").unwrap();
        }
    }
}

/// Forwards `x` to the application named `to` (a `Probe`) through a
/// handle, and adds 1 to the sum it answers.
struct Pipeline;

#[derive(Serialize, Deserialize, Debug)]
struct Forward {
    x: Vec<f32>,
    to: String,
}

#[derive(Serialize, Deserialize, Debug)]
struct Forwarded {
    sum: f32,
    pid: u32,
    by: u32,
}

impl Deployment for Pipeline {
    const NAME: &'static str = "serve_tests.Pipeline";
    type Init = ();
    type Request = Forward;
    type Response = Forwarded;

    fn new(_: ()) -> Result<Self, String> {
        Ok(Pipeline)
    }

    async fn call(&self, forward: Forward) -> Result<Forwarded, HandlerError> {
        let probe = DeploymentHandle::<Probe>::new(forward.to);
        let ask = Ask {
            x: Some(forward.x),
            ..Ask::default()
        };
        let reply = probe
            .call(&Some(ask))
            .await
            .map_err(|e| HandlerError::Failed(e.to_string()))?;
        Ok(Forwarded {
            sum: reply.sum + 1.0,
            pid: reply.pid,
            by: std::process::id(),
        })
    }
}

#[derive(Serialize, Deserialize, Debug)]
pub struct Reply {
    pid: u32,
    pub version: String,
    sum: f32,
    /// The size of the batch it was answered in (0: not batched).
    batch: usize,
    tag: Option<String>,
}

impl Deployment for Probe {
    const NAME: &'static str = "serve_tests.Probe";
    type Init = String;
    type Request = Option<Ask>;
    type Response = Reply;

    fn new(version: String) -> Result<Self, String> {
        if version == "fail" {
            return Err("refused to start: the model file is missing".into());
        }
        Ok(Probe {
            version,
            tag: Default::default(),
        })
    }

    async fn call(&self, ask: Option<Ask>) -> Result<Reply, HandlerError> {
        let ask = ask.unwrap_or_default();
        if ask.panic {
            panic!("asked to panic");
        }
        let mut marker = Marker::start(ask.marker);
        if ask.hold_ms > 0 {
            tokio::time::sleep(Duration::from_millis(ask.hold_ms)).await;
        }
        marker.done = true;
        let sum = match ask.x {
            Some(x) if x.len() != 3 => {
                return Err(HandlerError::BadRequest(format!(
                    "x must hold 3 numbers, got {}",
                    x.len()
                )))
            }
            Some(x) => x.iter().sum(),
            None => 0.0,
        };
        Ok(Reply {
            pid: std::process::id(),
            version: self.version.clone(),
            sum,
            batch: 0,
            tag: self.tag.borrow().clone(),
        })
    }

    /// Takes `{"tag": T}`; refuses it if `"refused_by"` is its pid.
    fn reconfigure(&self, config: serde_json::Value) -> Result<(), String> {
        let tag = config["tag"].as_str().ok_or("no tag")?;
        if config["refused_by"].as_u64() == Some(u64::from(std::process::id())) {
            return Err(format!("tag {tag:?} is not allowed here"));
        }
        *self.tag.borrow_mut() = Some(tag.to_string());
        Ok(())
    }

    /// Holds once for the longest `hold_ms` asked, then answers each
    /// request with the batch's size.
    async fn call_batch(&self, asks: Vec<Option<Ask>>) -> Vec<Result<Reply, HandlerError>> {
        let hold = asks
            .iter()
            .flatten()
            .map(|ask| ask.hold_ms)
            .max()
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(hold)).await;
        let size = asks.len();
        asks.into_iter()
            .map(|_| {
                Ok(Reply {
                    pid: std::process::id(),
                    version: self.version.clone(),
                    sum: 0.0,
                    batch: size,
                    tag: self.tag.borrow().clone(),
                })
            })
            .collect()
    }
}

pub fn probe(version: &str) -> Application {
    Application::new::<Probe>(version.to_string())
        .unwrap()
        .route_prefix("/probe")
        .num_cpus(0.5)
}

async fn start() -> Serve {
    Serve::start(HttpOptions::default().port(0)).await.unwrap()
}

/// One HTTP answer: status, `Retry-After`, body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    retry_after: Option<String>,
    body: String,
}

impl Answer {
    pub fn reply(&self) -> Reply {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{self:?}: {e}"))
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into()
}

fn post_with(agent: &ureq::Agent, url: &str, body: &str) -> Answer {
    let mut response = agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    Answer {
        status: response.status().as_u16(),
        retry_after: response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string()),
        body: response.body_mut().read_to_string().unwrap(),
    }
}

/// Every answer is 200 (else the first that is not).
fn assert_all_ok(answers: &[Answer]) {
    assert!(
        answers.iter().all(|a| a.status == 200),
        "{:?}",
        answers.iter().find(|a| a.status != 200)
    );
}

/// POSTs `body` to `url` from a blocking thread.
pub async fn post(url: String, body: String) -> Answer {
    tokio::task::spawn_blocking(move || post_with(&agent(), &url, &body))
        .await
        .unwrap()
}

/// `threads` clients POSTing `body` to `url` in a loop until `stop`.
fn load(
    url: String,
    body: &str,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<Answer>> {
    let body = body.to_string();
    tokio::task::spawn_blocking(move || {
        let clients: Vec<_> = (0..threads)
            .map(|_| {
                let (url, body, stop) = (url.clone(), body.clone(), stop.clone());
                std::thread::spawn(move || {
                    let agent = agent();
                    let mut answers = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        answers.push(post_with(&agent, &url, &body));
                    }
                    answers
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|client| client.join().unwrap())
            .collect()
    })
}

/// Waits until `done` holds for the serve status, failing after `within`.
async fn wait_status(
    serve: &Serve,
    within: Duration,
    what: &str,
    done: impl Fn(&nimbus_serve::ServeStatus) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        let status = serve.status().await.unwrap();
        if done(&status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not within {within:?}: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn routes_across_replicas_and_ingresses(_: &mut nimbus::Driver) {
    let serve = start().await;
    let addresses = serve.addresses();
    assert_eq!(addresses.len(), 2, "one ingress per node: {addresses:?}");
    serve.run(probe("v1").num_replicas(2)).await.unwrap();
    let mut pids = BTreeSet::new();
    for address in &addresses {
        let stop = Arc::new(AtomicBool::new(false));
        let running = load(
            format!("http://{address}/probe/sum"),
            r#"{"x": [1, 2, 3.5]}"#,
            4,
            stop.clone(),
        );
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let answers = running.await.unwrap();
        assert!(answers.len() >= 4, "{} answers", answers.len());
        for answer in answers {
            assert_eq!(answer.status, 200, "{answer:?}");
            let reply = answer.reply();
            assert_eq!(reply.sum, 6.5);
            assert_eq!(reply.version, "v1");
            pids.insert(reply.pid);
        }
    }
    assert_eq!(pids.len(), 2, "both replicas answered: {pids:?}");
    // An empty body reads as `null`.
    let empty = post(format!("http://{}/probe", addresses[0]), String::new()).await;
    assert_eq!(empty.status, 200, "{empty:?}");
    let status = serve.status().await.unwrap();
    assert_eq!(status.applications.len(), 1);
    assert!(
        status.applications[0].replicas.iter().all(|r| r.healthy),
        "{status:?}"
    );
    serve.shutdown().await.unwrap();
}

async fn bad_input_gets_clear_answers(_: &mut nimbus::Driver) {
    let serve = Serve::start(HttpOptions::default().port(0).max_body_bytes(1024))
        .await
        .unwrap();
    serve.run(probe("v1")).await.unwrap();
    let base = format!("http://{}", serve.addresses()[0]);
    let malformed = post(format!("{base}/probe"), "{\"x\": [1, 2".into()).await;
    assert_eq!(malformed.status, 400, "{malformed:?}");
    assert!(
        malformed.body.contains("serve_tests.Probe"),
        "{malformed:?}"
    );
    let unknown_field = post(format!("{base}/probe"), r#"{"y": 1}"#.into()).await;
    assert_eq!(unknown_field.status, 400, "{unknown_field:?}");
    assert!(
        unknown_field.body.contains("unknown field"),
        "{unknown_field:?}"
    );
    let shape = post(format!("{base}/probe"), r#"{"x": [1, 2]}"#.into()).await;
    assert_eq!(shape.status, 400, "{shape:?}");
    assert!(
        shape.body.contains("x must hold 3 numbers, got 2"),
        "{shape:?}"
    );
    let unrouted = post(format!("{base}/elsewhere"), "{}".into()).await;
    assert_eq!(unrouted.status, 404, "{unrouted:?}");
    assert!(unrouted.body.contains("/elsewhere"), "{unrouted:?}");
    let near_miss = post(format!("{base}/prober"), "{}".into()).await;
    assert_eq!(
        near_miss.status, 404,
        "a prefix matches whole segments: {near_miss:?}"
    );
    let large = post(
        format!("{base}/probe"),
        format!("{{\"x\": [{}]}}", "1,".repeat(1000) + "1"),
    )
    .await;
    assert_eq!(large.status, 413, "{large:?}");
    let before = post(format!("{base}/probe"), "{}".into()).await.reply().pid;
    let panicked = post(format!("{base}/probe"), r#"{"panic": true}"#.into()).await;
    assert_eq!(panicked.status, 500, "{panicked:?}");
    assert!(panicked.body.contains("asked to panic"), "{panicked:?}");
    let after = post(format!("{base}/probe"), "{}".into()).await;
    assert_eq!(after.status, 200, "{after:?}");
    assert_eq!(
        after.reply().pid,
        before,
        "the replica that panicked serves on"
    );
    // Settings are checked before anything starts.
    let bad_prefix = serve.run(probe("v1").route_prefix("probe/")).await;
    assert!(
        matches!(
            bad_prefix,
            Err(ServeError::Setting {
                setting: "route_prefix",
                ..
            })
        ),
        "{bad_prefix:?}"
    );
    let taken = serve.run(probe("v1").name("another")).await;
    assert!(
        matches!(
            taken,
            Err(ServeError::Controller(ControllerError::RouteTaken { .. }))
        ),
        "{taken:?}"
    );
    serve.shutdown().await.unwrap();
}

async fn overload_is_refused_with_retry_after(_: &mut nimbus::Driver) {
    let serve = start().await;
    serve
        .run(probe("v1").max_ongoing_requests(1).max_queued_requests(1))
        .await
        .unwrap();
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let asks: Vec<_> = (0..4)
        .map(|_| tokio::spawn(post(url.clone(), r#"{"hold_ms": 1500}"#.into())))
        .collect();
    let mut statuses = Vec::new();
    for ask in asks {
        let answer = ask.await.unwrap();
        if answer.status == 503 {
            assert_eq!(answer.retry_after.as_deref(), Some("1"), "{answer:?}");
            assert!(answer.body.contains("overloaded"), "{answer:?}");
        }
        statuses.push(answer.status);
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [200, 200, 503, 503],
        "one runs, one waits, two are refused"
    );
    serve.shutdown().await.unwrap();
}

async fn failed_constructor_fails_the_deploy(_: &mut nimbus::Driver) {
    let serve = start().await;
    let failed = serve.run(probe("fail")).await;
    match failed {
        Err(ServeError::Controller(ControllerError::Deploy { deployment, detail })) => {
            assert_eq!(deployment, "serve_tests.Probe");
            assert!(detail.contains("the model file is missing"), "{detail}");
        }
        other => panic!("expected a failed deploy, got {other:?}"),
    }
    let answer = post(
        format!("http://{}/probe", serve.addresses()[0]),
        "{}".into(),
    )
    .await;
    assert_eq!(answer.status, 404, "nothing serves: {answer:?}");
    assert!(serve.status().await.unwrap().applications.is_empty());
    serve.shutdown().await.unwrap();
}

async fn rolling_update_under_load_fails_nothing(_: &mut nimbus::Driver) {
    let serve = start().await;
    serve.run(probe("v1").num_replicas(2)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let running = load(url.clone(), r#"{"hold_ms": 5}"#, 4, stop.clone());
    serve.run(probe("v2").num_replicas(2)).await.unwrap();
    let after = post(url, "{}".into()).await;
    stop.store(true, Ordering::Relaxed);
    assert_eq!(after.reply().version, "v2");
    let answers = running.await.unwrap();
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        answers.len(),
        failed.first()
    );
    let versions: BTreeSet<String> = answers.iter().map(|a| a.reply().version).collect();
    assert!(versions.contains("v1"), "{versions:?}");
    let status = serve.status().await.unwrap();
    assert_eq!(status.applications[0].replicas.len(), 2, "{status:?}");
    serve.shutdown().await.unwrap();
}

async fn batching_gathers_requests_only_while_busy(_: &mut nimbus::Driver) {
    let serve = start().await;
    let refused = serve
        .run(probe("v1").batching(8, Duration::from_millis(100)))
        .await;
    assert!(
        matches!(
            refused,
            Err(ServeError::Setting {
                setting: "max_ongoing_requests",
                ..
            })
        ),
        "{refused:?}"
    );
    let batched = probe("v1")
        .max_ongoing_requests(16)
        .batching(8, Duration::from_millis(100));
    serve.run(batched).await.unwrap();
    let url = format!("http://{}/probe", serve.addresses()[0]);
    // One client at a time: the replica is idle at each request, which
    // starts alone at once.
    for _ in 0..5 {
        let answer = post(url.clone(), r#"{"hold_ms": 1}"#.into()).await;
        assert_eq!(answer.reply().batch, 1, "{answer:?}");
    }
    // Eight clients: requests gather while a batch runs.
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(url.clone(), r#"{"hold_ms": 20}"#, 8, stop.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = post(url.clone(), r#"{"hold_ms": 20}"#.into()).await;
        if answer.reply().batch > 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no batch of more than one request formed"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let answers = running.await.unwrap();
    assert_all_ok(&answers);
    let largest = answers.iter().map(|a| a.reply().batch).max().unwrap();
    assert!((2..=8).contains(&largest), "batches of up to 8: {largest}");
    // A bad body in a batch is answered 400 alone.
    let bad = post(url, r#"{"x": [1, 2"#.into()).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    serve.shutdown().await.unwrap();
}

async fn killed_replica_is_restarted_under_load(_: &mut nimbus::Driver) {
    let serve = start().await;
    serve.run(probe("v1").num_replicas(2)).await.unwrap();
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let victim = post(url.clone(), "{}".into()).await.reply().pid;
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(url.clone(), r#"{"hold_ms": 5}"#, 4, stop.clone());
    // SAFETY: a plain syscall on a process of this test's cluster.
    assert_eq!(unsafe { libc_kill(victim as i32, 9) }, 0);
    // The runtime restarts the replica's process; the controller's health
    // check routes to it again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut pids = BTreeSet::new();
    while pids.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no second replica answered after the kill: {pids:?}"
        );
        let answer = post(url.clone(), "{}".into()).await;
        if answer.status == 200 {
            let pid = answer.reply().pid;
            if pid != victim {
                pids.insert(pid);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let answers = running.await.unwrap();
    let failed: Vec<_> = answers.iter().filter(|a| a.status != 200).collect();
    // At most the requests in flight on the killed replica fail (this
    // ingress sends it at most max_ongoing_requests at once).
    assert!(
        failed.len() <= nimbus_serve::DEFAULT_MAX_ONGOING as usize,
        "{} of {} failed: {:?}",
        failed.len(),
        answers.len(),
        failed
    );
    for failure in failed {
        assert_eq!(failure.status, 503, "{failure:?}");
        assert_eq!(failure.retry_after.as_deref(), Some("1"));
    }
    wait_status(
        &serve,
        Duration::from_secs(30),
        "both replicas healthy",
        |status| status.applications[0].replicas.iter().all(|r| r.healthy),
    )
    .await;
    serve.shutdown().await.unwrap();
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// Waits until `path` exists.
async fn wait_for_file(path: &std::path::Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{what}: no {} within 20 s",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that closes its connection while the replica runs its request
/// cancels it there: the call is dropped, and the replica (one request at
/// a time) takes the next one at once instead of after the 60 s it held.
async fn a_client_that_leaves_cancels_its_request(_: &mut nimbus::Driver) {
    use tokio::io::AsyncWriteExt;

    let serve = start().await;
    serve
        .run(probe("v1").max_ongoing_requests(1))
        .await
        .unwrap();
    let address = serve.addresses()[0];
    let dir = std::env::temp_dir().join(format!("serve-cancel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("held");
    let body = serde_json::json!({ "hold_ms": 60_000, "marker": marker }).to_string();
    let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "POST /probe HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    wait_for_file(
        &marker.with_extension("started"),
        "the request reached the replica",
    )
    .await;
    drop(client);
    wait_for_file(
        &marker.with_extension("dropped"),
        "the left client's call is cancelled",
    )
    .await;
    let next = post(format!("http://{address}/probe"), "{}".into()).await;
    assert_eq!(next.status, 200, "{next:?}");
    serve.shutdown().await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Twelve clients on one replica that runs one request at a time: eleven
/// wait in the ingress's queue, woken each time a request ends, and every
/// request is answered (a wake-up is not a pick: they used to run out of
/// picks and get 503).
async fn queued_requests_wait_their_turn(_: &mut nimbus::Driver) {
    let serve = start().await;
    serve
        .run(probe("v1").max_ongoing_requests(1))
        .await
        .unwrap();
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(url, r#"{"hold_ms": 5}"#, 12, stop.clone());
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let answers = running.await.unwrap();
    assert!(answers.len() >= 12, "{} answers", answers.len());
    assert_all_ok(&answers);
    serve.shutdown().await.unwrap();
}

/// An autoscaled application: one replica at first, three under a step
/// of six clients (one request on each wanted, at most three), back to
/// one once the load is gone; no request fails on the way.
async fn autoscaling_follows_the_load(_: &mut nimbus::Driver) {
    let serve = start().await;
    let refused = serve
        .run(probe("v1").autoscaling(Autoscaling::new(3, 2)))
        .await;
    assert!(
        matches!(
            refused,
            Err(ServeError::Setting {
                setting: "max_replicas",
                ..
            })
        ),
        "{refused:?}"
    );
    let scaled = probe("v1").max_ongoing_requests(4).autoscaling(
        Autoscaling::new(1, 3)
            .target_ongoing_requests(1.0)
            .upscale_delay(Duration::from_millis(500))
            .downscale_delay(Duration::from_secs(2)),
    );
    serve.run(scaled).await.unwrap();
    let replicas = |n: usize| {
        move |status: &nimbus_serve::ServeStatus| status.applications[0].replicas.len() == n
    };
    wait_status(&serve, Duration::from_secs(5), "one replica", replicas(1)).await;
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(url.clone(), r#"{"hold_ms": 100}"#, 6, stop.clone());
    wait_status(
        &serve,
        Duration::from_secs(30),
        "scaled up under load",
        replicas(3),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let answers = running.await.unwrap();
    assert_all_ok(&answers);
    let pids: BTreeSet<u32> = answers.iter().map(|a| a.reply().pid).collect();
    assert!(pids.len() >= 2, "the new replicas served: {pids:?}");
    wait_status(
        &serve,
        Duration::from_secs(30),
        "scaled down when idle",
        replicas(1),
    )
    .await;
    let after = post(url, "{}".into()).await;
    assert_eq!(after.status, 200, "{after:?}");
    serve.shutdown().await.unwrap();
}

/// A node that joins after `Serve::start` gets an ingress of its own,
/// which serves the routes; once the node is stopped, its ingress is
/// forgotten.
async fn a_node_that_joins_later_gets_an_ingress(driver: &mut nimbus::Driver) {
    let serve = start().await;
    serve.run(probe("v1")).await.unwrap();
    let cluster = driver.local_cluster().expect("a local cluster");
    let index = cluster.add_node(&[]).unwrap();
    let joined = cluster.node(index).unwrap().name().to_string();
    let has_joined = |status: &nimbus_serve::ServeStatus| {
        status
            .ingresses
            .iter()
            .any(|ingress| ingress.node == joined)
    };
    wait_status(
        &serve,
        Duration::from_secs(30),
        "the joined node's ingress",
        has_joined,
    )
    .await;
    let status = serve.status().await.unwrap();
    let address = status
        .ingresses
        .iter()
        .find(|ingress| ingress.node == joined)
        .unwrap()
        .address;
    // Listed once it serves the routes.
    let answer = post(format!("http://{address}/probe"), "{}".into()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let cluster = driver.local_cluster().expect("a local cluster");
    assert!(
        cluster.stop(index, Duration::from_secs(20)).unwrap(),
        "the node stops"
    );
    wait_status(
        &serve,
        Duration::from_secs(30),
        "the stopped node's ingress forgotten",
        |status| {
            !status
                .ingresses
                .iter()
                .any(|ingress| ingress.node == joined)
        },
    )
    .await;
    serve.shutdown().await.unwrap();
}

/// A scale-up that waits for room goes on in the background: the
/// `slotted` application's second replica needs a `slot`, which only one
/// node offers and its first replica holds, so its start waits (listed as
/// `starting`) up to the spawn's 30 s deadline, and is tried again after;
/// meanwhile the `plain` application scales up under its own load, and
/// every request of both is answered.
async fn a_scale_up_waiting_for_room_holds_up_no_other_application(driver: &mut nimbus::Driver) {
    let cluster = driver.local_cluster().expect("a local cluster");
    let index = cluster
        .add_node(&["--resources", r#"{"slot": 1}"#])
        .unwrap();
    let serve = start().await;
    let scaled = |name: &str| {
        probe("v1")
            .name(name)
            .route_prefix(format!("/{name}"))
            .num_cpus(0.1)
            .max_ongoing_requests(4)
            .autoscaling(
                Autoscaling::new(1, 2)
                    .target_ongoing_requests(1.0)
                    .upscale_delay(Duration::from_millis(200))
                    .downscale_delay(Duration::from_secs(600)),
            )
    };
    let refused = serve.run(scaled("bad").resource("CPU", 1.0)).await;
    assert!(
        matches!(
            refused,
            Err(ServeError::Setting {
                setting: "resource",
                ..
            })
        ),
        "{refused:?}"
    );
    serve
        .run(scaled("slotted").resource("slot", 1.0))
        .await
        .unwrap();
    serve.run(scaled("plain")).await.unwrap();
    let of = |status: &nimbus_serve::ServeStatus, name: &str| {
        let app = status.applications.iter().find(|app| app.name == name);
        app.map(|app| (app.replicas.len(), app.starting))
    };
    let base = format!("http://{}", serve.addresses()[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let hold = r#"{"hold_ms": 100}"#;
    let slotted = load(format!("{base}/slotted"), hold, 4, stop.clone());
    wait_status(
        &serve,
        Duration::from_secs(30),
        "the slotted scale-up waiting for room",
        |status| of(status, "slotted") == Some((1, 1)),
    )
    .await;
    let plain = load(format!("{base}/plain"), hold, 4, stop.clone());
    wait_status(
        &serve,
        Duration::from_secs(20),
        "the plain application scaled up beside it",
        |status| of(status, "plain") == Some((2, 0)),
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    assert_all_ok(&slotted.await.unwrap());
    assert_all_ok(&plain.await.unwrap());
    serve.shutdown().await.unwrap();
    let cluster = driver.local_cluster().expect("a local cluster");
    assert!(
        cluster.stop(index, Duration::from_secs(20)).unwrap(),
        "the node stops"
    );
}

/// A redeploy that changes only the user config: the live replicas take
/// it in place (the same replicas, answering with the new tag); a config
/// that one of them refuses fails the redeploy, naming the refusal, and
/// the other, which had taken it, gets the config before back.
async fn a_new_user_config_reaches_the_live_replicas(_: &mut nimbus::Driver) {
    let serve = start().await;
    let app = |tag: &str| {
        probe("v1")
            .num_cpus(0.1)
            .num_replicas(2)
            .user_config(serde_json::json!({ "tag": tag }))
    };
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let tags = |url: String| async move {
        let mut tags = BTreeSet::new();
        for _ in 0..20 {
            tags.insert(post(url.clone(), "{}".into()).await.reply().tag);
        }
        tags
    };
    let replicas = |status: nimbus_serve::ServeStatus| -> Vec<_> {
        status.applications[0]
            .replicas
            .iter()
            .map(|r| r.id)
            .collect()
    };
    serve.run(app("a")).await.unwrap();
    let before = replicas(serve.status().await.unwrap());
    assert_eq!(
        tags(url.clone()).await,
        BTreeSet::from([Some("a".to_string())])
    );

    serve.run(app("b")).await.unwrap();
    assert_eq!(
        tags(url.clone()).await,
        BTreeSet::from([Some("b".to_string())])
    );
    assert_eq!(
        replicas(serve.status().await.unwrap()),
        before,
        "no replica restarted"
    );

    let pid = post(url.clone(), "{}".into()).await.reply().pid;
    let refused = probe("v1")
        .num_cpus(0.1)
        .num_replicas(2)
        .user_config(serde_json::json!({ "tag": "c", "refused_by": pid }));
    let refused = serve.run(refused).await.unwrap_err().to_string();
    assert!(
        refused.contains("refused the user config")
            && refused.contains("\"c\" is not allowed here"),
        "{refused}"
    );
    assert_eq!(
        tags(url.clone()).await,
        BTreeSet::from([Some("b".to_string())])
    );
    assert_eq!(replicas(serve.status().await.unwrap()), before);
    serve.shutdown().await.unwrap();
}

/// An application with `min_replicas` 0 starts with no replica; a request
/// waits at the ingress while one starts (at once: the 60 s upscale delay
/// does not apply, and the request's 20 s timeout would end it first),
/// and is answered; idle past the downscale delay, the application is
/// back at zero, and the next request brings a replica again.
async fn an_application_scales_to_zero_and_back_for_a_request(_: &mut nimbus::Driver) {
    let serve = Serve::start(
        HttpOptions::default()
            .port(0)
            .request_timeout(Duration::from_secs(20)),
    )
    .await
    .unwrap();
    let refused = serve
        .run(probe("v1").autoscaling(Autoscaling::new(0, 0)))
        .await;
    assert!(
        matches!(
            refused,
            Err(ServeError::Setting {
                setting: "max_replicas",
                ..
            })
        ),
        "{refused:?}"
    );
    let app = probe("v1").num_cpus(0.1).autoscaling(
        Autoscaling::new(0, 1)
            .upscale_delay(Duration::from_secs(60))
            .downscale_delay(Duration::from_secs(1)),
    );
    serve.run(app).await.unwrap();
    let replicas = |n: usize| {
        move |status: &nimbus_serve::ServeStatus| status.applications[0].replicas.len() == n
    };
    wait_status(&serve, Duration::from_secs(5), "no replica", replicas(0)).await;
    let url = format!("http://{}/probe", serve.addresses()[0]);
    for round in ["a cold start", "a second cold start"] {
        let answer = post(url.clone(), "{}".into()).await;
        assert_eq!(answer.status, 200, "{round}: {answer:?}");
        wait_status(
            &serve,
            Duration::from_secs(30),
            &format!("back to zero after {round}"),
            replicas(0),
        )
        .await;
    }
    serve.shutdown().await.unwrap();
}

/// Model composition: the `pipeline` application's replicas call the
/// `probe` application's through a `DeploymentHandle` (another process:
/// the sum comes back from it, plus one); a call to an application that
/// is not deployed, or with a request the probe refuses, fails naming
/// it; a handle outside a replica says so.
async fn a_deployment_calls_another_through_a_handle(_: &mut nimbus::Driver) {
    let serve = start().await;
    serve
        .run(probe("v1").name("probe").num_cpus(0.1).num_replicas(2))
        .await
        .unwrap();
    let pipeline = Application::new::<Pipeline>(())
        .unwrap()
        .name("pipeline")
        .route_prefix("/pipeline")
        .num_cpus(0.1);
    serve.run(pipeline).await.unwrap();
    let url = format!("http://{}/pipeline", serve.addresses()[0]);
    let forward = |x: &str, to: &str| format!(r#"{{"x": {x}, "to": "{to}"}}"#);
    let answer = post(url.clone(), forward("[1, 2, 3]", "probe")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let answered: Forwarded = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(answered.sum, 7.0);
    assert_ne!(
        answered.pid, answered.by,
        "the probe answered from its own replica"
    );

    let missing = post(url.clone(), forward("[1, 2, 3]", "nowhere")).await;
    assert_eq!(missing.status, 500, "{missing:?}");
    assert!(
        missing.body.contains("no application named nowhere"),
        "{missing:?}"
    );
    let refused = post(url, forward("[1]", "probe")).await;
    assert_eq!(refused.status, 500, "{refused:?}");
    assert!(
        refused.body.contains("probe answered 400")
            && refused.body.contains("x must hold 3 numbers"),
        "{refused:?}"
    );

    let outside = DeploymentHandle::<Probe>::new("probe").call(&None).await;
    assert_eq!(
        outside.unwrap_err(),
        nimbus_serve::HandleError::NotInReplica
    );
    serve.shutdown().await.unwrap();
}

/// The controller's process is killed under load: requests go on being
/// answered (the replicas and ingresses serve on), and the restarted
/// controller takes its application back from its saved state: the same
/// replicas, which it then replaces in a rolling update and stops at
/// shutdown (the harness finds nothing left in use).
async fn a_restarted_controller_takes_its_applications_back(driver: &mut nimbus::Driver) {
    let serve = start().await;
    serve
        .run(probe("v1").num_cpus(0.1).num_replicas(2))
        .await
        .unwrap();
    let replicas = |status: &nimbus_serve::ServeStatus| -> BTreeSet<_> {
        status
            .applications
            .iter()
            .flat_map(|app| app.replicas.iter().map(|r| r.id))
            .collect()
    };
    let before = replicas(&serve.status().await.unwrap());
    let url = format!("http://{}/probe", serve.addresses()[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(url.clone(), r#"{"hold_ms": 5}"#, 2, stop.clone());

    let client = driver.local_cluster().unwrap().client().await.unwrap();
    let controller = client
        .actors()
        .await
        .unwrap()
        .into_iter()
        .find(|actor| {
            actor.type_name == <nimbus_serve::Controller as nimbus::actor::RemoteActor>::NAME
                && actor.dead.is_none()
        })
        .expect("the controller runs");
    let mut seen = client.last_event_seq().await.unwrap();
    // SAFETY: a plain syscall on a process of this test's cluster.
    assert_eq!(unsafe { libc_kill(controller.pid as i32, 9) }, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    'restarted: loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the controller did not restart within 30 s"
        );
        for event in client.events(seen, left).await.unwrap() {
            seen = event.seq;
            if let ClusterEventKind::ActorStarted {
                actor, incarnation, ..
            } = event.kind
            {
                if actor == controller.actor && incarnation != controller.incarnation {
                    break 'restarted;
                }
            }
        }
    }
    wait_status(
        &serve,
        Duration::from_secs(30),
        "the application back with the same replicas",
        |status| replicas(status) == before,
    )
    .await;

    serve
        .run(probe("v2").num_cpus(0.1).num_replicas(2))
        .await
        .unwrap();
    let after = replicas(&serve.status().await.unwrap());
    assert!(
        after.is_disjoint(&before),
        "v2's replicas are new: {after:?}"
    );
    stop.store(true, Ordering::Relaxed);
    assert_all_ok(&running.await.unwrap());
    let answer = post(url, "{}".into()).await;
    assert_eq!(answer.reply().version, "v2");
    serve.shutdown().await.unwrap();
}
