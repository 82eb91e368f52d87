//! The `nimbus` command line, as a user runs it.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Output};

use super::dashboard::line_value;

use tempfile::TempDir;

/// Runs `nimbus stop` when dropped, so a failing test leaves no node behind.
pub struct StopOnDrop<'a>(pub &'a Path);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        let _ = nimbus(self.0, &["stop", "--timeout-s", "5"]);
    }
}

pub fn nimbus(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(args)
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap()
}

pub fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `nimbus args`, which must succeed; returns what it printed.
pub fn succeeds(home: &Path, args: &[&str]) -> String {
    let output = nimbus(home, args);
    assert!(
        output.status.success(),
        "nimbus {args:?}: {}",
        text(&output)
    );
    text(&output)
}

/// Runs `nimbus args`, which must fail with an error containing `needle`.
pub fn fails_with(home: &Path, args: &[&str], needle: &str) {
    let output = nimbus(home, args);
    assert!(!output.status.success(), "nimbus {args:?} succeeded");
    assert!(
        text(&output).contains(needle),
        "nimbus {args:?}: {}",
        text(&output)
    );
}

pub fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn unused_token() -> String {
    format!("nimbus1-{}", "A".repeat(43))
}

/// The arguments of `nimbus start` for a head on loopback port `port`.
pub fn head_start(port: &str) -> [&str; 6] {
    [
        "start",
        "--head",
        "--port",
        port,
        "--node-ip-address",
        "127.0.0.1",
    ]
}

/// Starts a head on loopback with `nimbus start --head` under `home`;
/// its address, its token and what `start` printed.
pub fn start_head(home: &Path) -> (String, String, String) {
    let port = free_port().to_string();
    let out = succeeds(home, &head_start(&port));
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("a token line")
        .to_string();
    (format!("127.0.0.1:{port}"), token, out)
}

/// Starts a head on loopback under `home` with `head_flags` added, then a
/// member named each of `members` joining it with `member_flags` added;
/// what each `start` printed, the head's first.
pub fn start_cluster(
    home: &Path,
    head_flags: &[&str],
    members: &[&str],
    member_flags: &[&str],
) -> Vec<String> {
    let port = free_port().to_string();
    let head = succeeds(home, &[&head_start(&port)[..], head_flags].concat());
    let address = format!("127.0.0.1:{port}");
    let mut printed = vec![head];
    for name in members {
        let join = [
            "start",
            "--address",
            &address,
            "--node-ip-address",
            "127.0.0.1",
            "--node-name",
            name,
        ];
        printed.push(succeeds(home, &[&join[..], member_flags].concat()));
    }
    printed
}

/// A head given a token (`--token-file`, or `NIMBUS_HEAD_TOKEN`: one its
/// members were given beforehand, as a Kubernetes Secret) takes it
/// instead of making one, and does not print it; a file other users can
/// read is refused, naming it.
#[test]
fn a_head_takes_the_token_it_is_given_and_does_not_print_it() {
    use std::os::unix::fs::PermissionsExt;
    let token = unused_token();
    let joins = |home: &Path, printed: &str| {
        let address = line_value(printed, "address:");
        let status = Command::new(env!("CARGO_BIN_EXE_nimbus"))
            .args(["status", "--address", &address])
            .env("NIMBUS_HOME", home)
            .env("NIMBUS_TOKEN", &token)
            .output()
            .unwrap();
        assert!(status.status.success(), "{}", text(&status));
        assert!(!printed.contains(&token), "{printed}");
    };

    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let file = home.join("given-token");
    std::fs::write(&file, &token).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let port = free_port().to_string();
    let start = [
        &head_start(&port)[..],
        &["--token-file", file.to_str().unwrap()],
    ]
    .concat();
    let refused = nimbus(home, &start);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("given-token"), "{}", text(&refused));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    joins(home, &succeeds(home, &start));

    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let port = free_port().to_string();
    let started = Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(head_start(&port))
        .env("NIMBUS_HOME", home)
        .env("NIMBUS_HEAD_TOKEN", &token)
        .output()
        .unwrap();
    assert!(started.status.success(), "{}", text(&started));
    joins(home, &text(&started));
}

#[test]
fn start_status_and_stop_as_a_user_would() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let ip = ["--node-ip-address", "127.0.0.1"];

    let (address, token, out) = start_head(home);
    let port = address.rsplit(':').next().unwrap().to_string();
    assert!(out.contains(&format!("address: {address}")), "{out}");
    assert!(out.contains("token-file: "), "{out}");

    let join = [
        "start",
        "--address",
        &address,
        "--token",
        &token,
        "--num-cpus",
        "2",
    ];
    succeeds(home, &[&join[..], &ip].concat());

    let status = nimbus(home, &["status", "--json"]);
    assert!(status.status.success(), "{}", text(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let nodes = json["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    for node in nodes {
        assert_eq!(node["state"], "alive");
        assert!(node["id"].is_string() && node["incarnation"].is_u64());
        assert!(node["resources"]["total"]["CPU"].is_number());
        // What each node runs, as it said when it joined.
        assert_eq!(node["versions"]["nimbus"], env!("CARGO_PKG_VERSION"));
        assert_eq!(node["versions"]["protocol"], nimbus::wire::PROTOCOL_VERSION);
    }
    // Its reader gone before it prints (`nimbus status --json | head -0`):
    // it ends as Unix tools do, on SIGPIPE, instead of panicking.
    let mut piped = Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(["status", "--json"])
        .env("NIMBUS_HOME", home)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(piped.stdout.take());
    let mut stderr = String::new();
    std::io::Read::read_to_string(piped.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    let ended = piped.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&ended),
        Some(libc::SIGPIPE),
        "{ended:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let table = succeeds(home, &["status"]);
    let said = format!(
        "nimbus {} protocol v{}",
        env!("CARGO_PKG_VERSION"),
        nimbus::wire::PROTOCOL_VERSION
    );
    assert_eq!(table.matches(&said).count(), 2, "{table}");
    let memory = succeeds(home, &["memory"]);
    assert!(
        memory.contains("0 objects (0 owned, 0 cached copies), 0 of"),
        "{memory}"
    );
    let memory = nimbus(home, &["memory", "--json"]);
    assert!(memory.status.success(), "{}", text(&memory));
    let memory: serde_json::Value = serde_json::from_slice(&memory.stdout).unwrap();
    let stores = memory["nodes"].as_array().unwrap();
    assert_eq!(stores.len(), 2, "{memory}");
    assert!(stores
        .iter()
        .all(|n| n["objects"] == 0 && n["capacity"].as_u64().unwrap() > 0));
    let cpus: f64 = nodes
        .iter()
        .map(|n| n["resources"]["total"]["CPU"].as_f64().unwrap())
        .sum();
    let table = succeeds(home, &["status", "--address", &address, "--token", &token]);
    assert!(table.contains("2 alive, 0 dead"), "{table}");
    assert!(
        table.contains(&format!("cluster (alive nodes): CPU={cpus} ")),
        "{table}"
    );

    let status_with =
        |token: &str| ["status", "--address", &address, "--token", token].map(str::to_string);
    let wrong = status_with(&unused_token());
    let wrong: Vec<&str> = wrong.iter().map(String::as_str).collect();
    fails_with(home, &wrong, "is the join token right?");
    let malformed = status_with("hunter2");
    let malformed: Vec<&str> = malformed.iter().map(String::as_str).collect();
    fails_with(home, &malformed, "invalid join token");
    fails_with(
        home,
        &["start", "--head", "--port", &port],
        "already in use",
    );
    fails_with(
        home,
        &[
            "start",
            "--address",
            &address,
            "--heartbeat-timeout-ms",
            "100",
        ],
        "--head",
    );

    // The operator rotates the head's ticket key; a second rotation waits
    // for the first (a day's lifetime: two days and a quarter).
    let rotating = succeeds(home, &["rotate-ticket-key"]);
    assert!(
        rotating.contains("rotating the head's ticket key: the new key signs from"),
        "{rotating}"
    );
    fails_with(
        home,
        &["rotate-ticket-key"],
        "a rotation of the ticket key is under way",
    );

    let stopped = succeeds(home, &["stop", "--force"]);
    assert!(
        stopped.contains("killed node"),
        "--force kills at once: {stopped}"
    );
    assert!(stopped.contains("stopped 2 node(s)"), "{stopped}");
    let after = [
        "status",
        "--address",
        &address,
        "--token",
        &token,
        "--timeout-s",
        "1",
    ];
    fails_with(home, &after, "no nimbus node answered");
}

#[test]
fn bad_addresses_and_resources_fail_with_clear_errors() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let address = format!("127.0.0.1:{}", free_port());
    let token = unused_token();
    let status = [
        "status",
        "--address",
        &address,
        "--token",
        &token,
        "--timeout-s",
        "1",
    ];
    fails_with(home, &status, "no nimbus node answered");
    let join = [
        "start",
        "--address",
        &address,
        "--token",
        &token,
        "--resources",
        r#"{"GPU": 1}"#,
    ];
    fails_with(home, &join, "built in");
    let join = ["start", "--address", "nowhere", "--token", &token];
    fails_with(home, &join, "bad address");
    fails_with(home, &["status"], "no head was started on this machine");
}

/// Every value a person writes on the command line or in a plan file, when
/// wrong, fails with an error naming it and a non-zero exit: no node is
/// left running with a half-right configuration. Before, a fractional GPU
/// count, an empty or path-like node name, an unusable spill directory and
/// a misspelt plan key were all accepted (the last silently did nothing).
#[test]
fn every_bad_flag_or_plan_fails_with_an_error_naming_it() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let port = free_port().to_string();
    let head = head_start(&port);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--num-cpus=-1"],
            "amounts must be finite and not negative",
        ),
        (
            &["--num-cpus", "nan"],
            "amounts must be finite and not negative",
        ),
        (
            &["--num-gpus", "inf"],
            "amounts must be finite and not negative",
        ),
        (&["--num-gpus", "1.5"], "not a whole number"),
        (&["--memory=-5"], "--memory"),
        (
            &["--resources", "{bad"],
            "--resources must be a JSON object",
        ),
        (&["--resources", r#"{"x": -1}"#], "amounts must be finite"),
        (&["--node-name="], "is not allowed"),
        (&["--node-name", "../a"], "is not allowed"),
        (
            &["--object-spill-dir", "/proc/no/such"],
            "the spill directory",
        ),
        (&["--heartbeat-timeout-ms", "0"], "--heartbeat-timeout-ms"),
        (
            &["--object-arrival-timeout-s", "0"],
            "--object-arrival-timeout-s",
        ),
        (&["--log-max-mib", "0"], "--log-max-mib"),
    ];
    for (extra, needle) in cases {
        let args: Vec<&str> = head.iter().chain(extra.iter()).copied().collect();
        fails_with(home, &args, needle);
    }
    let port_too_big = ["start", "--head", "--port", "99999"];
    fails_with(home, &port_too_big, "--port");
    let missing = [
        "start",
        "--address",
        "127.0.0.1:1",
        "--token-file",
        "/no/such/token",
    ];
    fails_with(home, &missing, "/no/such/token");

    let plans = TempDir::new().unwrap();
    let misspelt = plans.path().join("misspelt.toml");
    std::fs::write(&misspelt, "seed = 1\n[[actor_fault]]\naction = \"kill\"\n").unwrap();
    let misspelt = misspelt.to_str().unwrap();
    fails_with(
        home,
        &["chaos", "run", misspelt, "--", "true"],
        "unknown field `actor_fault`",
    );
    let absent = ["chaos", "run", "/no/such/plan.toml", "--", "true"];
    fails_with(home, &absent, "/no/such/plan.toml");
}

#[test]
fn chaos_run_injects_a_plan_while_a_command_runs() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let plan = home.join("plan.toml");
    std::fs::write(
        &plan,
        "seed = 9\n[[faults]]\nat_ms = 100\naction = { kill_node = { node = \"random\" } }\n",
    )
    .unwrap();
    let plan = plan.to_str().unwrap();
    let chaos = |command: &[&str]| {
        let args = [
            "chaos",
            "run",
            plan,
            "--nodes",
            "3",
            "--heartbeat-timeout-ms",
            "1000",
            "--",
        ];
        nimbus(home, &[&args[..], command].concat())
    };
    // The workload: checks it was given the cluster, and runs past the fault.
    let workload = [
        "sh",
        "-c",
        "test -n \"$NIMBUS_ADDRESS\" && test -n \"$NIMBUS_TOKEN\" && sleep 2",
    ];
    let ran = chaos(&workload);
    let out = text(&ran);
    assert!(ran.status.success(), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("fault 1 t=") && l.contains(" kill_node target=node-")),
        "{out}"
    );
    assert!(out.contains("declared dead after"), "{out}");
    assert!(out.contains("the command succeeded"), "{out}");

    let failed = chaos(&["false"]);
    let out = text(&failed);
    assert!(!failed.status.success(), "{out}");
    assert!(out.contains("replay") && out.contains("seed = 9"), "{out}");
}

/// A program's `--help` prints its own text (not `ClusterArgs`' docs) and
/// starts no cluster: nothing is left in its temporary or state directory.
/// Before, `init` started a local cluster first, and clap's exit left its
/// directory behind.
#[test]
fn a_programs_help_starts_no_cluster() {
    let examples = Path::new(env!("CARGO_BIN_EXE_nimbus"))
        .parent()
        .unwrap()
        .join("examples");
    let cases = [
        ("tasks", "Remote tasks and the object store"),
        ("train_mnist", "Data-parallel MNIST on a nimbus cluster"),
        ("rl_cartpole", "PPO on CartPole-v1"),
        ("custom_actor", "Your own actors across a cluster"),
        ("microbench", "Microbenchmarks of nimbus' building blocks"),
    ];
    for (example, about) in cases {
        let (tmp, home) = (TempDir::new().unwrap(), TempDir::new().unwrap());
        let out = Command::new(examples.join(example))
            .arg("--help")
            .env("TMPDIR", tmp.path())
            .env("NIMBUS_HOME", home.path())
            .env_remove("NIMBUS_ADDRESS")
            .output()
            .unwrap_or_else(|e| {
                panic!("{example}: {e} (built by `cargo build --workspace --examples`)")
            });
        let help = text(&out);
        assert!(out.status.success(), "{example}: {help}");
        assert!(help.contains(about), "{example}: {help}");
        assert!(help.contains("--token-file"), "{example}: {help}");
        assert!(
            !help.contains("The command-line flags"),
            "{example}: {help}"
        );
        for dir in [tmp.path(), home.path()] {
            let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
            assert!(
                left.is_empty(),
                "{example} --help left {left:?} in {}",
                dir.display()
            );
        }
    }
}

/// Ray's `ray.init()` after `ray start --head`: a program given no
/// address joins the head started on this machine (found in
/// `$NIMBUS_HOME`) instead of starting a private cluster, and its job is
/// listed there, ended as soon as the program ended; with the record stale (the head stopped), it starts a
/// private cluster again.
#[test]
fn a_program_without_an_address_joins_the_head_started_on_this_machine() {
    let tasks = Path::new(env!("CARGO_BIN_EXE_nimbus"))
        .parent()
        .unwrap()
        .join("examples/tasks");
    let (home, tmp) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let run = || {
        Command::new(&tasks)
            .args([
                "--tasks",
                "20",
                "--maps",
                "2",
                "--broadcast-mib",
                "1",
                "--readers",
                "1",
            ])
            .env("NIMBUS_HOME", home.path())
            .env("TMPDIR", tmp.path())
            .env_remove("NIMBUS_ADDRESS")
            .env_remove("NIMBUS_TOKEN")
            .output()
            .unwrap()
    };
    {
        let _stop = StopOnDrop(home.path());
        let (address, _, _) = start_head(home.path());
        let out = run();
        let printed = text(&out);
        assert!(out.status.success(), "{printed}");
        assert!(
            printed.contains("joining the head started on this machine"),
            "{printed}"
        );
        assert!(printed.contains(&address), "{printed}");
        let jobs = succeeds(home.path(), &["job", "list", "--json"]);
        let jobs: serde_json::Value = serde_json::from_str(jobs.trim()).unwrap();
        let attached: Vec<_> = jobs
            .as_array()
            .unwrap()
            .iter()
            .filter(|job| {
                job["submitted"] == false && job["entrypoint"].as_str().unwrap().contains("tasks")
            })
            .collect();
        assert_eq!(attached.len(), 1, "the program's job is the head's: {jobs}");
        assert_eq!(
            attached[0]["state"], "SUCCEEDED",
            "a driver that ended says so (before: RUNNING until the grace passed): {jobs}"
        );
    }
    // The head is stopped and its record gone: a private cluster again.
    let out = run();
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(!printed.contains("joining the head"), "{printed}");
}

#[test]
fn plot_redraws_a_runs_losses_and_names_what_is_missing() {
    use nimbus::train::results::{ReportLine, ResultsLog};
    let (home, run) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let run_dir = run.path().to_str().unwrap();
    fails_with(home.path(), &["plot", run_dir], "metrics.jsonl");
    let mut log = ResultsLog::open(run.path()).unwrap();
    for index in 1..=5 {
        let metrics = [("loss".to_string(), 1.0 / index as f64)].into();
        log.append(&ReportLine::now(index, 0, metrics)).unwrap();
    }
    let printed = succeeds(home.path(), &["plot", run_dir]);
    assert!(printed.contains("plotted 5 reports"), "{printed}");
    let svg = std::fs::read_to_string(run.path().join("loss.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("loss"), "{svg}");
}
