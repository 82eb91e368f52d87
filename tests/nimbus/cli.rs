//! The `nimbus` command line, as a user runs it.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Output};

use tempfile::TempDir;

/// Runs `nimbus stop` when dropped, so a failing test leaves no node behind.
struct StopOnDrop<'a>(&'a Path);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = nimbus(self.0, &["stop", "--timeout-s", "5"]);
    }
}

fn nimbus(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(args)
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn start_status_and_stop_as_a_user_would() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let port = free_port().to_string();

    let started = nimbus(
        home,
        &[
            "start",
            "--head",
            "--port",
            &port,
            "--node-ip-address",
            "127.0.0.1",
        ],
    );
    assert!(started.status.success(), "{}", text(&started));
    let out = String::from_utf8_lossy(&started.stdout).to_string();
    let address = format!("127.0.0.1:{port}");
    assert!(out.contains(&format!("address: {address}")), "{out}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("a token line")
        .to_string();
    assert!(out.contains("token-file: "), "{out}");

    let joined = nimbus(
        home,
        &[
            "start",
            "--address",
            &address,
            "--token",
            &token,
            "--num-cpus",
            "2",
            "--node-ip-address",
            "127.0.0.1",
        ],
    );
    assert!(joined.status.success(), "{}", text(&joined));

    let status = nimbus(home, &["status", "--json"]);
    assert!(status.status.success(), "{}", text(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let nodes = json["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    for node in nodes {
        assert_eq!(node["state"], "alive");
        assert!(node["id"].is_string() && node["incarnation"].is_u64());
        assert!(node["resources"]["total"]["CPU"].is_number());
    }
    let table = nimbus(home, &["status", "--address", &address, "--token", &token]);
    assert!(text(&table).contains("2 alive, 0 dead"), "{}", text(&table));

    let wrong_token = format!("nimbus1-{}", "A".repeat(43));
    let refused = nimbus(
        home,
        &["status", "--address", &address, "--token", &wrong_token],
    );
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("is the join token right?"),
        "{}",
        text(&refused)
    );

    let malformed = nimbus(
        home,
        &["status", "--address", &address, "--token", "hunter2"],
    );
    assert!(!malformed.status.success());
    assert!(
        text(&malformed).contains("invalid join token"),
        "{}",
        text(&malformed)
    );

    let port_taken = nimbus(home, &["start", "--head", "--port", &port]);
    assert!(!port_taken.status.success());
    assert!(
        text(&port_taken).contains("already in use"),
        "{}",
        text(&port_taken)
    );

    let stopped = nimbus(home, &["stop"]);
    assert!(stopped.status.success(), "{}", text(&stopped));
    assert!(
        text(&stopped).contains("stopped 2 node(s)"),
        "{}",
        text(&stopped)
    );
    let after = nimbus(
        home,
        &[
            "status",
            "--address",
            &address,
            "--token",
            &token,
            "--timeout-s",
            "1",
        ],
    );
    assert!(!after.status.success());
}

#[test]
fn joining_an_unreachable_head_fails_with_a_clear_error() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let address = format!("127.0.0.1:{}", free_port());
    let token = format!("nimbus1-{}", "A".repeat(43));
    let output = nimbus(
        home,
        &[
            "status",
            "--address",
            &address,
            "--token",
            &token,
            "--timeout-s",
            "1",
        ],
    );
    assert!(!output.status.success());
    assert!(
        text(&output).contains("no nimbus node answered"),
        "{}",
        text(&output)
    );
    let bad_resources = nimbus(
        home,
        &[
            "start",
            "--address",
            &address,
            "--token",
            &token,
            "--resources",
            "{\"GPU\": 1}",
        ],
    );
    assert!(!bad_resources.status.success());
    assert!(
        text(&bad_resources).contains("built in"),
        "{}",
        text(&bad_resources)
    );
}
