//! The dashboard in a real browser (headless Chromium through the DevTools
//! protocol), against a cluster started with the CLI. Screenshots of every
//! page land in `target/dashboard-screenshots/`.
//!
//! Needs Debian's `chromium` (`.ci/run` installs it); without it these
//! tests say so loudly and pass without looking.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tempfile::TempDir;

use super::browser::Browser;
use super::cli::{free_port, head_start, nimbus, start_cluster, succeeds, text, StopOnDrop};

/// The longest a page may take to show what a test waits for.
const PAGE_DEADLINE: Duration = Duration::from_secs(30);
/// The longest the custom-actor example may take to reach its summary.
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(180);

/// Chromium, if this machine has it.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("NIMBUS_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "\n\n*** SKIPPED: no Chromium at {} (apt-get install chromium, or set NIMBUS_CHROMIUM): the dashboard was NOT tested in a browser ***\n\n",
            path.display()
        );
        None
    }
}

/// A headless browser showing one page.
fn browser(chromium: PathBuf) -> Browser {
    Browser::launch(&chromium, (1400, 900), PAGE_DEADLINE)
}

/// Loads `url` and waits until the JavaScript expression `condition`
/// holds (re-checked on every change of the page, in the page), for at
/// most [`PAGE_DEADLINE`]; `what` names it in the failure.
fn open_and_wait(tab: &Browser, url: &str, condition: &str, what: &str) {
    tab.navigate(url);
    wait_until(tab, condition, what);
}

/// Follows the page's own link to `route` (`#/actors`: no reload, as a
/// person clicking in the menu) and waits for `condition` as
/// [`open_and_wait`] does.
fn go_and_wait(tab: &Browser, route: &str, condition: &str, what: &str) {
    tab.evaluate(&format!("location.hash = {route:?}"));
    wait_until(tab, condition, what);
}

/// Waits in the page for `condition` (a JavaScript expression) to hold.
fn wait_until(tab: &Browser, condition: &str, what: &str) {
    // Before the browser's own deadline, so that this one is reported.
    let deadline = tab
        .deadline()
        .saturating_sub(Duration::from_secs(5))
        .as_millis();
    let script = format!(
        r#"new Promise((resolve, reject) => {{
            const check = () => {{ try {{ return Boolean({condition}); }} catch (e) {{ return false; }} }};
            if (check()) {{ resolve(true); return; }}
            const observer = new MutationObserver(() => {{ if (check()) {{ observer.disconnect(); resolve(true); }} }});
            observer.observe(document, {{ subtree: true, childList: true, characterData: true, attributes: true }});
            setTimeout(() => {{ observer.disconnect(); resolve(document.body.innerText); }}, {deadline});
        }})"#
    );
    let result = tab.evaluate(&script);
    assert_eq!(
        result,
        serde_json::Value::Bool(true),
        "the page did not show {what} within {deadline} ms; it shows:\n{result}"
    );
}

/// Saves what the tab shows as `target/dashboard-screenshots/NAME.png`.
fn screenshot(tab: &Browser, name: &str) {
    let png = tab.screenshot();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// The text the rows of the page's table show in `column`.
fn column(tab: &Browser, column: &str) -> Vec<String> {
    let script = format!(
        r#"(() => {{
            const heads = [...document.querySelectorAll("main table thead th")].map((th) => th.textContent);
            const at = heads.indexOf({column:?});
            return [...document.querySelectorAll("main table tbody tr")].map((tr) => tr.children[at].textContent);
        }})()"#
    );
    serde_json::from_value(tab.evaluate(&script)).unwrap_or_default()
}

/// The value on the line `PREFIX VALUE` of `printed`.
pub fn line_value(printed: &str, prefix: &str) -> String {
    printed
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{printed}"))
        .trim()
        .to_string()
}

pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_nimbus"))
        .parent()
        .unwrap()
        .join("examples")
        .join(name)
}

/// The custom-actor example run with `--hold` against the head at `head`
/// (its token in `home`): it returns once the example printed its summary, its actors
/// still alive; closing its stdin ends it.
pub struct HeldExample {
    child: Child,
    lines: mpsc::Receiver<String>,
    printed: Vec<String>,
}

impl HeldExample {
    pub fn start(home: &Path, head: &str) -> Self {
        let mut child = Command::new(example("custom_actor"))
            .args(["--hold", "--address", head])
            .env("NIMBUS_HOME", home)
            .env_remove("NIMBUS_ADDRESS")
            .env_remove("NIMBUS_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut held = HeldExample {
            child,
            lines,
            printed: Vec::new(),
        };
        loop {
            let line = held
                .lines
                .recv_timeout(EXAMPLE_DEADLINE)
                .unwrap_or_else(|e| {
                    panic!(
                        "custom_actor did not hold its actors ({e}):\n{}",
                        held.printed.join("\n")
                    )
                });
            let holding = line.starts_with("holding the actors");
            held.printed.push(line);
            if holding {
                return held;
            }
        }
    }

    /// Closes its stdin and waits for it to exit successfully.
    pub fn finish(mut self) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "custom_actor: {status}:\n{}",
            self.printed.join("\n")
        );
    }
}

impl Drop for HeldExample {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_dashboard_shows_nodes_actors_objects_and_a_jobs_log() {
    let Some(chromium) = chromium() else { return };
    let home = TempDir::new().unwrap();
    let _stop = StopOnDrop(home.path());
    let started = start_cluster(
        home.path(),
        &["--dashboard-port", "0"],
        &["node-1", "node-2"],
        &[],
    );
    let url = line_value(&started[0], "dashboard:");
    let head = line_value(&started[0], "address:");
    assert!(url.starts_with("http://127.0.0.1:"), "{}", started[0]);
    // A finished job whose log the page must show.
    let tasks = example("tasks");
    let submitted = succeeds(
        home.path(),
        &[
            "job",
            "submit",
            "--name",
            "dashboard-tasks",
            "--",
            tasks.to_str().unwrap(),
            "--tasks",
            "20",
            "--maps",
            "2",
            "--broadcast-mib",
            "1",
            "--readers",
            "1",
        ],
    );
    let job = line_value(&submitted, "job:");
    let summary = line_value(&submitted, "summary:");
    // A training job with a restart, whose run the page must plot.
    let storage = TempDir::new().unwrap();
    let train = example("train_mnist");
    let trained = succeeds(
        home.path(),
        &[
            "job",
            "submit",
            "--",
            train.to_str().unwrap(),
            "--workers",
            "2",
            "--epochs",
            "1",
            "--train-samples",
            "640",
            "--batch-size",
            "32",
            "--fail-at-step",
            "6",
            // A restart from the checkpoint, marked on the loss curve.
            "--no-peer-heal",
            "--checkpoint-every",
            "3",
            "--storage",
            storage.path().to_str().unwrap(),
        ],
    );
    let run_dir = line_value(&trained, "results:");
    let run_dir = Path::new(run_dir.split(' ').next().unwrap());
    let reports = nimbus::train::results::read_reports(run_dir).unwrap();
    let points = nimbus::train::results::loss_curves(&reports)["loss"].len();
    assert_eq!(points, 10, "10 steps, each reporting its loss");
    let runs = succeeds(home.path(), &["list", "runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(runs.trim()).unwrap();
    let run = runs[0]["id"].as_str().unwrap().to_string();
    // A Tune experiment, whose trials (each over a second) the page must
    // show as runs.
    let tune_mnist = example("tune_mnist");
    let tune_storage = TempDir::new().unwrap();
    succeeds(
        home.path(),
        &[
            "job",
            "submit",
            "--",
            tune_mnist.to_str().unwrap(),
            "--samples",
            "2",
            "--concurrent",
            "1",
            "--epochs",
            "2",
            "--train-samples",
            "1000",
            "--scheduler",
            "fifo",
            "--storage",
            tune_storage.path().to_str().unwrap(),
        ],
    );
    let runs = succeeds(home.path(), &["list", "runs", "--json"]);
    let runs: serde_json::Value = serde_json::from_str(runs.trim()).unwrap();
    let trial = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("/trial_00000"))
        })
        .unwrap_or_else(|| panic!("trial 0 of the experiment among the runs: {runs}"));
    let trial = trial["id"].as_str().unwrap().to_string();
    let held = HeldExample::start(home.path(), &head);

    let tab = browser(chromium);
    open_and_wait(
        &tab,
        &format!("{url}#/cluster"),
        r#"document.getElementById("summary")?.textContent === "3 alive, 0 dead" && document.querySelectorAll("main table")[0].querySelectorAll("tbody tr").length === 3"#,
        "three alive nodes",
    );
    // Each node's machine: CPU use and memory, from its heartbeats.
    wait_until(
        &tab,
        r#"[...document.querySelectorAll("main table tbody tr")].every((tr) => tr.querySelector(".host-cpu")?.textContent.endsWith("%"))"#,
        "every node's machine CPU",
    );
    // The activity charts: the bank driver's calls, pushed to the head.
    wait_until(
        &tab,
        r#"Number(document.getElementById("total-actor_calls")?.textContent) >= 200 && document.querySelector('svg.spark[data-metric="actor_calls"] polyline') !== null"#,
        "the bank's calls in the activity charts",
    );
    let nodes = column(&tab, "node");
    assert!(nodes.contains(&format!("{head} (head)")), "{nodes:?}");
    assert!(
        nodes.contains(&"node-1".to_string()) && nodes.contains(&"node-2".to_string()),
        "{nodes:?}"
    );
    assert!(
        tab.evaluate(r#"document.getElementById("live").textContent"#) == "live",
        "the page listens to the cluster's events"
    );
    screenshot(&tab, "cluster");

    // The listing keeps dead actors too (the example's finished task
    // workers): the filter narrows it to the live ones.
    go_and_wait(
        &tab,
        "#/actors",
        r#"document.querySelectorAll("main table tbody tr").length >= 6"#,
        "the actors listed",
    );
    tab.evaluate(
        r#"(() => { const f = document.querySelector(".toolbar input"); f.value = "ALIVE"; f.dispatchEvent(new Event("input")); })()"#,
    );
    wait_until(
        &tab,
        r#"[...document.querySelectorAll("main table tbody tr")].length === 6"#,
        "the bank's six live actors",
    );
    let names = column(&tab, "name");
    for account in ["account-0", "account-1", "account-2", "account-3", "bank"] {
        assert!(names.contains(&account.to_string()), "{names:?}");
    }
    let restarts = column(&tab, "restarts");
    let restarted: Vec<&String> = names
        .iter()
        .zip(&restarts)
        .filter(|(_, r)| r.as_str() == "1")
        .map(|(n, _)| n)
        .collect();
    assert_eq!(restarted, vec!["account-1"], "{names:?} {restarts:?}");
    screenshot(&tab, "actors");
    // The filter narrows the table without reloading the page.
    tab.evaluate(
        r#"(() => { const f = document.querySelector(".toolbar input"); f.value = "account-1"; f.dispatchEvent(new Event("input")); })()"#,
    );
    wait_until(
        &tab,
        r#"document.querySelectorAll("main table tbody tr").length === 1 && document.querySelector("main table tbody tr").textContent.includes("account-1")"#,
        "only account-1 after filtering",
    );

    for (page, what) in [
        ("objects", "Objects"),
        ("tasks", "Tasks"),
        ("placement-groups", "Placement groups"),
    ] {
        go_and_wait(
            &tab,
            &format!("#/{page}"),
            &format!(
                r#"document.querySelector("main h2")?.textContent === {what:?} && document.querySelector(".toolbar span")?.textContent !== """#
            ),
            what,
        );
        screenshot(&tab, page);
    }

    go_and_wait(
        &tab,
        "#/jobs",
        &format!(r#"document.querySelector("main table tbody")?.textContent.includes({job:?})"#),
        "the submitted job",
    );
    screenshot(&tab, "jobs");
    go_and_wait(
        &tab,
        &format!("#/jobs/{job}"),
        &format!(
            r#"document.getElementById("log")?.textContent.includes({:?}) && document.getElementById("job-state")?.textContent === "SUCCEEDED""#,
            format!("summary: {summary}")
        ),
        "the job's summary line in its log",
    );
    screenshot(&tab, "job");

    go_and_wait(
        &tab,
        "#/runs",
        &format!(r#"document.querySelector("main table tbody")?.textContent.includes({run:?})"#),
        "the training run",
    );
    go_and_wait(
        &tab,
        &format!("#/runs/{run}"),
        &format!(
            r#"document.querySelectorAll('#loss-chart circle.point[data-metric="loss"]').length === {points} && document.getElementById("run-state")?.textContent === "FINISHED""#
        ),
        "a loss curve with a point per report",
    );
    assert_eq!(
        tab.evaluate(r##"document.querySelectorAll("#loss-chart line.restart").length"##),
        1,
        "the restart is marked on the curve"
    );
    let timeline = tab.evaluate(r#"document.getElementById("timeline").textContent"#);
    let timeline = timeline.as_str().unwrap();
    assert!(
        timeline.contains("killed by signal 9") && timeline.contains("after the failure"),
        "{timeline}"
    );
    screenshot(&tab, "training-run");
    go_and_wait(
        &tab,
        &format!("#/runs/{trial}"),
        r#"document.querySelectorAll('#loss-chart circle.point[data-metric="loss"]').length === 2 && document.getElementById("run-state")?.textContent === "FINISHED""#,
        "a Tune trial's losses, a point per epoch",
    );
    screenshot(&tab, "tune-trial");

    // The events: account-1's kill and restart, the training run's
    // recovery, the members joining.
    go_and_wait(
        &tab,
        "#/events",
        r#"(() => { const t = document.querySelector("main table tbody")?.textContent || "";
            return t.includes("restarting") && t.includes("training restored") && t.includes("node-2"); })()"#,
        "the kill, the recovery and the joins on the timeline",
    );
    screenshot(&tab, "events");
    held.finish();
}

/// One HTTP/1.1 exchange on a fresh connection: status, headers, body.
fn http(address: &str, request: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(PAGE_DEADLINE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    parse_response(&response)
}

/// An HTTP/1.1 response's status, headers and body.
fn parse_response(response: &str) -> (u16, String, String) {
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

pub fn get(address: &str, path: &str, cookie: Option<&str>) -> (u16, String, String) {
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    http(
        address,
        &format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n{cookie}Connection: close\r\n\r\n"),
    )
}

/// A loopback dashboard answers only to its secret: any user of the
/// machine can reach 127.0.0.1, but only its owner can read the URL (the
/// start's output, and `$NIMBUS_HOME/dashboard-url`, 0600). Without the
/// secret (or with another) every route is 401; with it in the URL the
/// page opens a session whose cookie the page's requests carry; a script
/// sends it as a bearer token. Before, loopback asked for nothing.
#[test]
fn a_loopback_dashboard_answers_only_to_its_secret() {
    let home = TempDir::new().unwrap();
    let _stop = StopOnDrop(home.path());
    let port = free_port().to_string();
    let started = succeeds(
        home.path(),
        &[&head_start(&port)[..], &["--dashboard-port", "0"]].concat(),
    );
    let url = line_value(&started, "dashboard:");
    let (base, secret) = url
        .split_once("/?secret=")
        .unwrap_or_else(|| panic!("no secret in {url}"));
    let address = base.strip_prefix("http://").unwrap();
    let kept = home.path().join("dashboard-url");
    assert_eq!(std::fs::read_to_string(&kept).unwrap().trim(), url);
    let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", kept.display());

    let routes = [
        "/",
        "/app.js",
        "/style.css",
        "/api/cluster",
        "/api/actors",
        "/api/timeline",
        "/api/activity",
        "/api/events",
        "/api/jobs/x/log",
        "/api/actors/x/log",
        "/api/runs/x",
    ];
    for route in routes {
        let (status, head, _) = get(address, route, None);
        assert_eq!(status, 401, "{route} without the secret: {head}");
        let wrong = format!("{route}?secret={}", "A".repeat(43));
        let (status, head, _) = get(address, &wrong, None);
        assert_eq!(status, 401, "{route} with another secret: {head}");
    }
    let (status, head, _) = get(address, &format!("/?secret={secret}"), None);
    assert_eq!(status, 200, "{head}");
    let session = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|c| c.split(';').next())
        .unwrap_or_else(|| panic!("no session cookie: {head}"))
        .to_string();
    let (status, _, body) = get(address, "/api/cluster", Some(&session));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"nodes\""), "{body}");
    let bearer = format!(
        "GET /api/timeline HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {secret}\r\nConnection: close\r\n\r\n"
    );
    let (status, _, body) = http(address, &bearer);
    assert_eq!(status, 200, "{body}");
}

/// One HTTPS exchange with `curl`, trusting only `cert`: status, headers,
/// body. `form`: a POST of that form.
fn https(
    cert: &Path,
    url: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> (u16, String, String) {
    let mut curl = Command::new("curl");
    curl.args(["-sS", "--max-time", "20", "-D", "-", "--cacert"])
        .arg(cert)
        .arg(url);
    if let Some(cookie) = cookie {
        curl.args(["-H", &format!("Cookie: {cookie}")]);
    }
    if let Some(form) = form {
        curl.args(["--data", form]);
    }
    let out = curl.output().expect("curl runs");
    let response = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "curl {url}: {}{response}", text(&out));
    parse_response(&response)
}

/// Medium finding 5 of #51: a dashboard bound beyond loopback serves HTTPS
/// only (a self-signed certificate made at its first start, kept in
/// `$NIMBUS_HOME/dashboard-tls`, its fingerprint printed), answers a
/// cleartext request with no page, and asks for its own read-only
/// credential (not the cluster token, which it refuses) before it sets a
/// `Secure` session cookie. Before, it served the login form over
/// cleartext HTTP and took the cluster token there.
#[test]
fn a_dashboard_beyond_loopback_serves_https_and_asks_for_its_credential() {
    let home = TempDir::new().unwrap();
    let _stop = StopOnDrop(home.path());
    let port = free_port().to_string();
    let started = succeeds(
        home.path(),
        &[
            "start",
            "--head",
            "--port",
            &port,
            "--node-ip-address",
            "127.0.0.1",
            "--dashboard-host",
            "0.0.0.0",
            "--dashboard-port",
            "0",
        ],
    );
    let token = line_value(&started, "token:");
    let credential = line_value(&started, "dashboard-credential:");
    let fingerprint = line_value(&started, "dashboard-certificate:");
    let url = line_value(&started, "dashboard:");
    assert!(
        url.starts_with("https://127.0.0.1:"),
        "the URL names the node's address over HTTPS: {started}"
    );
    assert!(
        fingerprint.starts_with("SHA-256 ") && fingerprint.len() == 8 + 95,
        "{started}"
    );
    assert!(credential.starts_with("nimbus-dashboard1-") && credential != token);
    let tls = home.path().join("dashboard-tls");
    let cert = tls.join("cert.pem");
    for file in [
        cert.clone(),
        tls.join("key.pem"),
        home.path().join("dashboard-credential"),
    ] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
    }

    // Cleartext HTTP gets no page: the server expects a TLS handshake.
    let address = url.strip_prefix("https://").unwrap().to_string();
    let mut plain = TcpStream::connect(&address).unwrap();
    plain.set_read_timeout(Some(PAGE_DEADLINE)).unwrap();
    plain
        .write_all(format!("GET / HTTP/1.1\r\nHost: {address}\r\n\r\n").as_bytes())
        .unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    assert!(
        !answer.starts_with(b"HTTP/"),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    let (status, _, body) = https(&cert, &format!("{url}/api/cluster"), None, None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("sign in"), "{body}");
    let (status, _, body) = https(&cert, &format!("{url}/"), None, None);
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"name="credential""#) && !body.contains("app.js"),
        "{body}"
    );
    let login = |presented: &str| {
        https(
            &cert,
            &format!("{url}/login"),
            None,
            Some(&format!("credential={presented}")),
        )
    };
    let (status, _, body) = login(&token);
    assert_eq!(
        status, 401,
        "the cluster token is not the credential: {body}"
    );
    let (status, _, body) = login("nimbus-dashboard1-not-it");
    assert_eq!(status, 401, "{body}");
    let (status, head, _) = login(&credential);
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie: ")
                .then(|| &l[12..])
        })
        .unwrap_or_else(|| panic!("no cookie: {head}"));
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Secure"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap();
    let (status, _, body) = https(&cert, &format!("{url}/api/cluster"), Some(session), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("127.0.0.1:{port}")), "{body}");
    let forged = Some("nimbus_session=forged");
    let (status, _, _) = https(&cert, &format!("{url}/api/cluster"), forged, None);
    assert_eq!(status, 401);

    // Neither the token nor the credential is in a log of the head, nor
    // what the refused attempts presented; each refusal is logged with
    // where it came from.
    let logs = home.path().join("logs");
    let mut refusal_logged = false;
    for entry in std::fs::read_dir(&logs).unwrap() {
        let log = std::fs::read_to_string(entry.unwrap().path()).unwrap_or_default();
        assert!(!log.contains(&token), "a log holds the token");
        assert!(!log.contains(&credential), "a log holds the credential");
        assert!(
            !log.contains("nimbus-dashboard1-not-it"),
            "a log holds a presented credential"
        );
        refusal_logged |= log.contains("a sign-in from 127.0.0.1:");
    }
    assert!(refusal_logged, "no log names the refused sign-in's source");

    // In a browser (told to accept the self-signed certificate): the login
    // form, then the cluster.
    let Some(chromium) = chromium() else { return };
    let tab = Browser::launch_with(
        &chromium,
        (1400, 900),
        PAGE_DEADLINE,
        &["--ignore-certificate-errors"],
    );
    open_and_wait(
        &tab,
        &url,
        r#"document.querySelector("input[name=credential]") !== null"#,
        "the login form",
    );
    screenshot(&tab, "login");
    tab.click("input[name=credential]");
    tab.type_text(&credential);
    // The form posts, then the answer redirects to the cluster page.
    tab.click_and_wait_for_load("button[type=submit]");
    wait_until(
        &tab,
        r#"document.getElementById("summary")?.textContent === "1 alive, 0 dead""#,
        "the cluster after signing in",
    );
    let printed = text(&super::cli::nimbus(home.path(), &["status"]));
    assert!(printed.contains("1 alive"), "{printed}");
}

#[test]
fn a_chaos_runs_dashboard_shows_the_node_it_killed_while_the_command_runs() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let plan = home.join("plan.toml");
    std::fs::write(
        &plan,
        "seed = 3\n[[faults]]\nat_ms = 100\naction = { kill_node = { node = \"random\" } }\n",
    )
    .unwrap();
    // The command reads the Events page's API until the killed node is
    // declared dead there (within 30 s), and keeps what it read.
    let seen = home.join("timeline.json");
    let script = format!(
        "for i in $(seq 300); do \
           curl -sf -H \"Authorization: Bearer $NIMBUS_DASHBOARD_SECRET\" \"$NIMBUS_DASHBOARD/api/timeline\" > {seen} \
           && grep -q '\"node dead\"' {seen} && exit 0; \
           sleep 0.1; \
         done; exit 1",
        seen = seen.display()
    );
    let ran = nimbus(
        home,
        &[
            "chaos",
            "run",
            plan.to_str().unwrap(),
            "--nodes",
            "3",
            "--heartbeat-timeout-ms",
            "1000",
            "--dashboard-port",
            "0",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    let out = text(&ran);
    assert!(ran.status.success(), "{out}");
    let url = line_value(&out, "dashboard:");
    assert!(url.starts_with("http://127.0.0.1:"), "{out}");
    let timeline: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
    let killed = out
        .lines()
        .find_map(|l| l.split(" kill_node target=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no kill_node line: {out}"));
    assert!(
        timeline.as_array().unwrap().iter().any(|event| {
            event["kind"] == "node dead" && event["text"].as_str().unwrap().starts_with(killed)
        }),
        "{killed} is not dead in {timeline:#}"
    );
}
