//! A headless Chromium driven through the DevTools protocol, for the
//! dashboard's tests and bench: one page, and the few commands they use
//! (navigate, evaluate, click, type, screenshot).
//!
//! 1. [`Browser::launch`] starts Chromium with `--remote-debugging-port=0`
//!    in a profile and `TMPDIR` of its own, and reads the browser's
//!    WebSocket address from the `DevTools listening on ws://…` line it
//!    prints on stderr (within [`START_DEADLINE`]).
//! 2. Over that socket it opens one page (`Target.createTarget`) and
//!    attaches to it with a session of its own (`Target.attachToTarget`,
//!    flattened: each command names the session), then enables the page's
//!    events (`Page.enable`).
//! 3. Each command is a JSON message with a fresh `id`; the answer is the
//!    message with that `id`. Of the events read meanwhile, the page's
//!    `Page.loadEventFired` are counted, so that [`Browser::navigate`] and
//!    [`Browser::click_and_wait_for_load`] wait on it, never on a sleep.
//! 4. Every wait ends at the deadline given to `launch`; past it the test
//!    fails, naming what it waited for. Dropping the browser kills Chromium
//!    and removes its profile.
//!
//! Written on `tungstenite` rather than a DevTools crate: those generate
//! the whole protocol (headless_chrome took 47 s of the test build's CPU),
//! of which these tests use seven commands.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use tempfile::TempDir;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The longest Chromium may take to print its DevTools address.
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long one read of the socket blocks before the deadline is checked.
const READ_SLICE: Duration = Duration::from_millis(200);

/// A headless Chromium showing one page.
pub struct Browser {
    chromium: Child,
    connection: Mutex<Connection>,
    deadline: Duration,
    // Declared last: removed after Chromium has exited.
    _profile: TempDir,
}

struct Connection {
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    /// Load events read since the last navigation started.
    loads: usize,
}

impl Browser {
    /// Starts `chromium` headless with a `width` × `height` window; every
    /// wait of the browser ends after `deadline`.
    pub fn launch(chromium: &Path, size: (u32, u32), deadline: Duration) -> Browser {
        Browser::launch_with(chromium, size, deadline, &[])
    }

    /// [`launch`](Self::launch) with `flags` added to Chromium's.
    pub fn launch_with(
        chromium: &Path,
        (width, height): (u32, u32),
        deadline: Duration,
        flags: &[&str],
    ) -> Browser {
        let profile = TempDir::new().unwrap();
        let tmp = profile.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let mut child = Command::new(chromium)
            .args([
                "--headless",
                // Root in CI: Chromium's sandbox needs an unprivileged user.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-background-timer-throttling",
                "--disable-renderer-backgrounding",
                "--no-first-run",
                "--no-default-browser-check",
                "--password-store=basic",
                "--remote-debugging-port=0",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.path().join("user").display()),
            ])
            .args(flags)
            .arg("about:blank")
            // Chromium keeps its singleton socket under TMPDIR and leaves it
            // when killed: a directory removed with the profile.
            .env("TMPDIR", &tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromium.display()));
        // A Chromium that cannot be driven is stopped before the test fails.
        let connected = devtools_address(&mut child, chromium).and_then(|address| {
            tungstenite::connect(address.as_str())
                .map_err(|e| format!("cannot connect to Chromium's DevTools at {address}: {e}"))
        });
        let socket = match connected {
            Ok((socket, _)) => socket,
            Err(why) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{why}");
            }
        };
        if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream.set_read_timeout(Some(READ_SLICE)).unwrap();
        }
        let browser = Browser {
            chromium: child,
            connection: Mutex::new(Connection {
                socket,
                session: String::new(),
                next_id: 1,
                loads: 0,
            }),
            deadline,
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }));
        let attached = browser.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        browser.connection.lock().unwrap().session =
            attached["sessionId"].as_str().unwrap().to_string();
        browser.call("Page.enable", json!({}));
        browser
    }

    /// How long each wait of the browser may take.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Loads `url` and waits for its load event.
    pub fn navigate(&self, url: &str) {
        self.until_load(|| {
            let answer = self.call("Page.navigate", json!({ "url": url }));
            if let Some(error) = answer.get("errorText").and_then(Value::as_str) {
                panic!("Chromium could not load {url}: {error}");
            }
            // Within the document (only the #fragment changed): nothing
            // loads, and no load event comes.
            answer.get("loaderId").is_some()
        });
    }

    /// The value of the JavaScript `expression` in the page (awaited when
    /// it is a promise); a thrown exception fails the test.
    pub fn evaluate(&self, expression: &str) -> Value {
        let answer = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
        );
        if let Some(thrown) = answer.get("exceptionDetails") {
            panic!("{expression} threw in the page: {thrown}");
        }
        answer["result"]
            .get("value")
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Waits for the element `selector` to be in the page; returns the
    /// middle of its box, `[x, y]`.
    pub fn wait_for_element(&self, selector: &str) -> Value {
        let wait_ms = self.deadline.as_millis();
        self.evaluate(&format!(
            r#"new Promise((resolve, reject) => {{
                const find = () => document.querySelector({selector:?});
                const middle = () => {{ const r = find().getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; }};
                if (find()) {{ resolve(middle()); return; }}
                const observer = new MutationObserver(() => {{ if (find()) {{ observer.disconnect(); resolve(middle()); }} }});
                observer.observe(document, {{ subtree: true, childList: true }});
                setTimeout(() => reject(new Error("no " + {selector:?} + " in the page")), {wait_ms});
            }})"#
        ))
    }

    /// Clicks the middle of the element `selector` as a mouse would, once
    /// it is in the page.
    pub fn click(&self, selector: &str) {
        let at = self.wait_for_element(selector);
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": at[0], "y": at[1], "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// Clicks `selector` (a form's submit button, a link) and waits for
    /// the page it loads.
    pub fn click_and_wait_for_load(&self, selector: &str) {
        self.until_load(|| {
            self.click(selector);
            true
        });
    }

    /// Types `text` into the element that has the focus, as a keyboard's
    /// input would.
    pub fn type_text(&self, text: &str) {
        self.call("Input.insertText", json!({ "text": text }));
    }

    /// What the page shows, as a PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        let answer = self.call("Page.captureScreenshot", json!({ "format": "png" }));
        base64::engine::general_purpose::STANDARD
            .decode(answer["data"].as_str().unwrap())
            .unwrap()
    }

    /// Runs `start` (which starts a navigation) and, if it says a page
    /// loads, waits for that page's load event.
    fn until_load(&self, start: impl FnOnce() -> bool) {
        self.connection.lock().unwrap().loads = 0;
        if !start() {
            return;
        }
        let deadline = Instant::now() + self.deadline;
        let mut connection = self.connection.lock().unwrap();
        while connection.loads == 0 {
            let event = connection.read(deadline, "a page's load event");
            connection.count(&event);
        }
    }

    /// Sends the command `method` to the page (or, before it is attached,
    /// to the browser) and returns its result.
    fn call(&self, method: &str, params: Value) -> Value {
        let deadline = Instant::now() + self.deadline;
        let mut connection = self.connection.lock().unwrap();
        let id = connection.next_id;
        connection.next_id += 1;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if !connection.session.is_empty() {
            command["sessionId"] = json!(connection.session);
        }
        connection
            .socket
            .send(Message::text(command.to_string()))
            .unwrap_or_else(|e| panic!("cannot send {method} to Chromium: {e}"));
        loop {
            let message = connection.read(deadline, method);
            if message["id"] == id {
                if let Some(error) = message.get("error") {
                    panic!("Chromium refused {method} {params}: {error}");
                }
                return message["result"].clone();
            }
            connection.count(&message);
        }
    }
}

impl Connection {
    /// Counts `event` if it is the page's load event.
    fn count(&mut self, event: &Value) {
        if event["method"] == "Page.loadEventFired" {
            self.loads += 1;
        }
    }

    /// The next message from Chromium, before `deadline`.
    fn read(&mut self, deadline: Instant, waiting_for: &str) -> Value {
        loop {
            if Instant::now() > deadline {
                panic!("Chromium did not answer {waiting_for} in time");
            }
            match self.socket.read() {
                Ok(Message::Text(text)) => return serde_json::from_str(text.as_str()).unwrap(),
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    panic!("Chromium's DevTools socket failed waiting for {waiting_for}: {e}")
                }
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.chromium.kill();
        let _ = self.chromium.wait();
    }
}

/// The browser's DevTools WebSocket address, from the line Chromium prints
/// on stderr once it listens; the rest of stderr is drained (and dropped)
/// so that Chromium never blocks writing it.
fn devtools_address(child: &mut Child, chromium: &Path) -> Result<String, String> {
    let stderr = child.stderr.take().unwrap();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut printed = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("ws://") {
                let _ = sender.send(Ok(line[at..].trim().to_string()));
            } else if printed.len() < 20 {
                printed.push(line);
            }
        }
        let _ = sender.send(Err(printed.join("\n")));
    });
    match receiver.recv_timeout(START_DEADLINE) {
        Ok(Ok(address)) => Ok(address),
        Ok(Err(printed)) => Err(format!(
            "{} exited before listening for DevTools; it printed:\n{printed}",
            chromium.display()
        )),
        Err(_) => Err(format!(
            "{} printed no DevTools address within {START_DEADLINE:?}",
            chromium.display()
        )),
    }
}
