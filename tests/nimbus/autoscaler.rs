//! `nimbus up` / `nimbus down` with a cluster config, as a user runs
//! them: a head that offers no CPUs, an autoscaler that launches node
//! processes for actors that wait, and stops them once idle.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::cli::{free_port, nimbus, succeeds, text};
use super::dashboard::{example, line_value};
use super::metrics::{scrape_until, total};

/// Runs `nimbus down CONFIG` when dropped, so a failing test leaves no
/// node behind.
struct DownOnDrop<'a>(&'a Path, &'a Path);

impl Drop for DownOnDrop<'_> {
    fn drop(&mut self) {
        let config = self.1.to_str().unwrap();
        let _ = nimbus(self.0, &["down", config, "--timeout-s", "20"]);
    }
}

/// A cluster config under `dir`: a head offering no CPUs on a free port,
/// node type `cpu-2` of at most `max` nodes, idle ones stopped after 3 s.
fn config(dir: &Path, provider: &str, max: u32) -> std::path::PathBuf {
    let path = dir.join("cluster.toml");
    let text = format!(
        "max_workers = {max}\nidle_timeout_s = 3\nlaunch_timeout_s = 60\n\
         [head]\nport = {}\nnode_ip_address = \"127.0.0.1\"\nresources = {{ CPU = 0 }}\n\
         metrics_export_port = 0\n\
         [provider]\n{provider}\n\
         [node_types.cpu-2]\nresources = {{ CPU = 2 }}\nmax_workers = {max}\n",
        free_port()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `nimbus status --json` until `done` holds of it, for at most `limit`.
fn status_until(
    home: &Path,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&succeeds(home, &["status", "--json"])).unwrap();
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "not within {limit:?}: {status:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The autoscale example with `args`, joining the head under `home`.
fn example_command(home: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(example("autoscale"));
    command
        .args(args)
        .env("NIMBUS_HOME", home)
        .env_remove("NIMBUS_ADDRESS")
        .env_remove("NIMBUS_TOKEN");
    command
}

/// The autoscale example with `args` and `--hold`, running until its
/// standard input is closed, and its summary line.
fn held_example(home: &Path, args: &[&str]) -> (std::process::Child, String) {
    let mut args = args.to_vec();
    args.push("--hold");
    let mut held = example_command(home, &args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(held.stdout.take().unwrap()));
    let summary = lines
        .find(|l| l.as_ref().is_ok_and(|l| l.starts_with("summary:")))
        .unwrap()
        .unwrap();
    // The rest of its output, read until it ends (it never writes to a
    // closed pipe).
    std::thread::spawn(move || lines.for_each(drop));
    (held, summary)
}

/// How long the example may run (its spawns wait up to 60 s).
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(90);

/// The autoscale example's output, run with `args` against the head under
/// `home`; killed, failing the test, past [`EXAMPLE_DEADLINE`].
fn run_example(home: &Path, args: &[&str]) -> std::process::Output {
    let child = example_command(home, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (done, output) = std::sync::mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match output.recv_timeout(EXAMPLE_DEADLINE) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill() with a valid signal number has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the autoscale example {args:?} did not end within {EXAMPLE_DEADLINE:?}");
        }
    }
}

/// Actors that no node fits wait while the autoscaler launches a node per
/// actor; the nodes are stopped after the idle timeout; `down` stops the
/// autoscaler and the head, and nothing is left.
#[test]
fn a_cluster_grows_for_waiting_actors_and_shrinks_once_they_are_gone() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let config = config(dir.path(), "kind = \"local\"", 2);
    let _down = DownOnDrop(home.path(), &config);
    let up = succeeds(home.path(), &["up", config.to_str().unwrap()]);
    assert!(up.contains("node types: cpu-2 (CPU=2; 0..2)"), "{up}");
    let metrics = line_value(&up, "metrics:");
    let status = status_until(home.path(), Duration::from_secs(10), |s| {
        s["autoscaler"]["node_types"][0]["running"] == 0
    });
    assert_eq!(
        status["nodes"].as_array().unwrap().len(),
        1,
        "the head alone: {status:#}"
    );

    let started = Instant::now();
    let out = run_example(
        home.path(),
        &["--actors", "2", "--cpus", "2", "--wait-s", "60"],
    );
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("summary: actors=2 nodes=2"), "{printed}");
    assert!(printed.contains("group_nodes=0"), "{printed}");
    for node in ["cpu-2-1", "cpu-2-2"] {
        assert!(printed.contains(&format!("on {node} after")), "{printed}");
    }
    println!("demand to placed: {:.2} s", started.elapsed().as_secs_f64());

    let idle = Instant::now();
    let status = status_until(home.path(), Duration::from_secs(40), |s| {
        let alive = s["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["state"] == "alive")
            .count();
        alive == 1 && s["autoscaler"]["node_types"][0]["running"] == 0
    });
    println!("idle to stopped: {:.2} s", idle.elapsed().as_secs_f64());
    let decisions = status["autoscaler"]["decisions"].to_string();
    for decision in [
        "launching cpu-2-1 (cpu-2) for 2 waiting demand(s)",
        "terminating cpu-2-1: idle",
        "terminating cpu-2-2: idle",
    ] {
        assert!(decisions.contains(decision), "{decisions}");
    }
    // Each decision is counted on the head's /metrics (and published as a
    // cluster event, which the dashboard's timeline shows).
    scrape_until(&metrics, "the autoscaler's decisions", |samples| {
        let decided = |kind| {
            total(
                samples,
                "nimbus_autoscaler_decisions_total",
                &[("kind", kind)],
            )
        };
        let running = total(
            samples,
            "nimbus_autoscaler_nodes",
            &[("type", "cpu-2"), ("state", "running")],
        );
        decided("launch") == 2.0 && decided("terminate") == 2.0 && running == 0.0
    });

    let down = succeeds(home.path(), &["down", config.to_str().unwrap()]);
    assert!(down.contains("stopped the autoscaler"), "{down}");
    assert!(down.contains("stopped the head"), "{down}");
    let left = std::fs::read_dir(home.path().join("autoscaler/launched"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "json")
        })
        .count();
    assert_eq!(left, 0, "no launched node is still recorded");
}

/// A demand that no node type offers fails at once, naming the largest
/// type; a provider whose launches fail backs off, and `status` says why.
#[test]
fn a_demand_no_type_offers_fails_at_once_and_failing_launches_back_off() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let provider = "kind = \"command\"\n\
                    launch = [\"sh\", \"-c\", \"echo no machines today >&2; exit 3\"]\n\
                    terminate = [\"true\"]";
    let config = config(dir.path(), provider, 2);
    let _down = DownOnDrop(home.path(), &config);
    succeeds(home.path(), &["up", config.to_str().unwrap()]);

    let started = Instant::now();
    let out = run_example(home.path(), &["--actors", "1", "--cpus", "8"]);
    let printed = text(&out);
    assert!(!out.status.success(), "{printed}");
    assert!(
        printed.contains("no node type offers it (the largest, cpu-2, offers CPU=2)"),
        "{printed}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "at once, not after the spawn's wait"
    );

    let out = run_example(
        home.path(),
        &["--actors", "1", "--cpus", "2", "--wait-s", "4"],
    );
    let printed = text(&out);
    assert!(
        !out.status.success(),
        "no node could be launched: {printed}"
    );
    let status = status_until(home.path(), Duration::from_secs(10), |s| {
        !s["autoscaler"]["node_types"][0]["backing_off"].is_null()
    });
    let backing_off = status["autoscaler"]["node_types"][0]["backing_off"][0].to_string();
    assert!(backing_off.contains("no machines today"), "{backing_off}");
    assert!(backing_off.contains("exit status: 3"), "{backing_off}");
    let human = succeeds(home.path(), &["status"]);
    assert!(human.contains("backing off"), "{human}");
}

/// A STRICT_SPREAD placement group of three bundles, on a cluster whose
/// head offers nothing, waits while the autoscaler launches a node per
/// bundle, and is reserved on three distinct nodes; a group no node type
/// can hold fails at once, naming the types.
#[test]
fn a_strict_spread_group_waits_for_a_node_per_bundle() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let config = config(dir.path(), "kind = \"local\"", 3);
    let _down = DownOnDrop(home.path(), &config);
    succeeds(home.path(), &["up", config.to_str().unwrap()]);

    let args = [
        "--actors", "0", "--cpus", "1", "--spread", "3", "--wait-s", "60",
    ];
    let out = run_example(home.path(), &args);
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("summary: actors=0 nodes=0"), "{printed}");
    assert!(printed.contains("group_nodes=3"), "{printed}");
    assert!(
        printed.contains("on cpu-2-1, cpu-2-2, cpu-2-3 after"),
        "{printed}"
    );

    let args = ["--actors", "0", "--cpus", "1", "--spread", "4"];
    let out = run_example(home.path(), &args);
    let printed = text(&out);
    assert!(!out.status.success(), "{printed}");
    assert!(
        printed.contains("the autoscaler may add nodes of types cpu-2 (CPU=2, at most 3)"),
        "{printed}"
    );
}

/// An autoscaler killed while its nodes run work is started again by
/// `nimbus up` beside the same head: it adopts the nodes it had launched
/// (launches none twice) and stops them once idle.
#[test]
fn a_restarted_autoscaler_adopts_its_nodes_and_launches_none_twice() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let config = config(dir.path(), "kind = \"local\"", 2);
    let _down = DownOnDrop(home.path(), &config);
    let up = succeeds(home.path(), &["up", config.to_str().unwrap()]);
    let pid: i32 = line_value(&up, "autoscaler: pid ")
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    // Two actors hold both nodes while the autoscaler is gone.
    let (mut held, summary) = held_example(home.path(), &["--actors", "2", "--cpus", "2"]);
    assert!(summary.contains("nodes=2"), "{summary}");
    // SIGKILL takes effect asynchronously: until the process has exited,
    // its command line still reads as a running autoscaler's. Its pidfd
    // becomes readable when it has.
    // SAFETY: pidfd_open takes a pid and flags; the descriptor is ours.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    assert!(
        pidfd >= 0,
        "pidfd_open: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: kill() with a valid signal number has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let mut exited = libc::pollfd {
        fd: pidfd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, valid for the call.
    let ready = unsafe { libc::poll(&mut exited, 1, 10_000) };
    assert_eq!(ready, 1, "the killed autoscaler still runs after 10 s");
    // SAFETY: the descriptor is ours and not used again.
    unsafe { libc::close(pidfd) };

    let again = succeeds(home.path(), &["up", config.to_str().unwrap()]);
    assert!(again.contains("starting the autoscaler again"), "{again}");
    let restarted: u32 = line_value(&again, "autoscaler: pid ")
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The head keeps the killed autoscaler's last report until the new
    // one reports: wait for the new one's.
    let status = status_until(home.path(), Duration::from_secs(20), |s| {
        s["autoscaler"]["pid"] == restarted && s["autoscaler"]["node_types"][0]["running"] == 2
    });
    let decisions = status["autoscaler"]["decisions"].to_string();
    assert!(
        !decisions.contains("launching"),
        "nothing launched twice: {decisions}"
    );

    drop(held.stdin.take());
    assert!(held.wait().unwrap().success());
    let status = status_until(home.path(), Duration::from_secs(40), |s| {
        s["autoscaler"]["node_types"][0]["running"] == 0
    });
    let decisions = status["autoscaler"]["decisions"].to_string();
    assert!(
        decisions.contains("terminating cpu-2-1: idle"),
        "{decisions}"
    );
    assert!(!decisions.contains("launching"), "{decisions}");
}

/// The Slurm provider, against stand-ins for `sbatch` and `scancel` on
/// PATH that log their arguments and run the job's `--wrap` command here:
/// a node is submitted as one job of one node with the type's CPUs, joins
/// with the token from the shared file, takes the waiting actor, and is
/// cancelled by its job id once idle.
#[test]
fn the_slurm_provider_submits_a_job_per_node_and_cancels_it_when_idle() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let sbatch = "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/sbatch.log\"\n\
                  for arg; do case \"$arg\" in --wrap=*) cmd=\"${arg#--wrap=}\";; esac; done\n\
                  setsid sh -c \"$cmd\" >/dev/null 2>&1 </dev/null &\necho \"$!\"\n";
    let scancel = "#!/bin/sh\necho \"$@\" >> \"$(dirname \"$0\")/scancel.log\"\nkill \"$1\"\n";
    for (name, text) in [("sbatch", sbatch), ("scancel", scancel)] {
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    let provider = format!(
        "kind = \"slurm\"\npartition = \"debug\"\ntoken_file = \"{}\"\nnimbus = \"{}\"\n\
         start_args = [\"--node-ip-address\", \"127.0.0.1\"]",
        home.path().join("token").display(),
        env!("CARGO_BIN_EXE_nimbus")
    );
    let config = config(dir.path(), &provider, 2);
    let _down = DownOnDrop(home.path(), &config);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let up = Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(["up", config.to_str().unwrap()])
        .env("NIMBUS_HOME", home.path())
        .env("PATH", &path)
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", text(&up));

    let out = run_example(
        home.path(),
        &["--actors", "1", "--cpus", "2", "--wait-s", "60"],
    );
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("on cpu-2-1 after"), "{printed}");
    let submitted = std::fs::read_to_string(bin.join("sbatch.log")).unwrap();
    assert!(
        submitted.starts_with(
            "--parsable --job-name=nimbus-cpu-2-1 --nodes=1 --ntasks=1 --cpus-per-task=2 --partition=debug --wrap=exec "
        ),
        "{submitted}"
    );
    assert!(
        submitted.contains(
            "--node-name cpu-2-1 --num-cpus 2 --num-gpus 0 --node-ip-address 127.0.0.1 --token-file"
        ),
        "{submitted}"
    );

    // The node may still count as launching in the latest report when the
    // example ends: wait for it to be neither, and cancelled.
    let status = status_until(home.path(), Duration::from_secs(40), |s| {
        let cpu_2 = &s["autoscaler"]["node_types"][0];
        cpu_2["running"] == 0 && cpu_2["launching"] == 0 && bin.join("scancel.log").exists()
    });
    // Every job submitted is cancelled by its id. (Usually one: a second
    // node is launched when the spawn is still listed as waiting while the
    // first node reserves its CPUs for the actor starting there, as when
    // shipping the program to it takes a while; README's "Not yet".)
    let cancelled = std::fs::read_to_string(bin.join("scancel.log")).unwrap();
    let submitted = std::fs::read_to_string(bin.join("sbatch.log")).unwrap();
    assert_eq!(
        cancelled.lines().count(),
        submitted.lines().count(),
        "{cancelled}\n{submitted}\n{:#}",
        status["autoscaler"]["decisions"]
    );
    assert!(
        cancelled
            .lines()
            .all(|job| !job.is_empty() && job.chars().all(|c| c.is_ascii_digit())),
        "job ids: {cancelled}"
    );
}

/// Room asked for ahead of use (`request_resources`): the autoscaler
/// launches the nodes with no spawn waiting, keeps them idle past the
/// idle timeout while the request stands, and lets them go once the
/// driver clears it.
#[test]
fn requested_capacity_is_launched_ahead_and_kept_while_the_request_stands() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let config = config(dir.path(), "kind = \"local\"", 2);
    let _down = DownOnDrop(home.path(), &config);
    succeeds(home.path(), &["up", config.to_str().unwrap()]);

    let started = Instant::now();
    let (mut held, summary) = held_example(
        home.path(),
        &["--actors", "0", "--cpus", "2", "--request", "2"],
    );
    assert!(summary.contains("actors=0"), "{summary}");
    status_until(home.path(), Duration::from_secs(40), |s| {
        s["autoscaler"]["node_types"][0]["running"] == 2
    });
    println!(
        "request to joined: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let shown = succeeds(home.path(), &["status"]);
    assert!(
        shown.contains("requested: 2 × CPU=2 (a cpu-2 node holds each)"),
        "{shown}"
    );

    // Idle for two seconds past idle_timeout_s (3 s), as the autoscaler
    // itself reports: still running, nothing stopped.
    let status = status_until(home.path(), Duration::from_secs(40), |s| {
        let idle = s["autoscaler"]["node_types"][0]["idle"].as_array().unwrap();
        idle.len() == 2 && idle.iter().all(|n| n[1].as_u64().unwrap() >= 5_000)
    });
    assert_eq!(status["autoscaler"]["node_types"][0]["running"], 2);
    let decisions = status["autoscaler"]["decisions"].to_string();
    assert!(!decisions.contains("terminating"), "{decisions}");
    assert!(
        decisions.contains("for the requested resources (2 bundles)"),
        "{decisions}"
    );

    // The driver clears its request as it ends: the idle nodes go.
    drop(held.stdin.take());
    assert!(held.wait().unwrap().success());
    let status = status_until(home.path(), Duration::from_secs(40), |s| {
        let cpu_2 = &s["autoscaler"]["node_types"][0];
        cpu_2["running"] == 0 && cpu_2["launching"] == 0
    });
    assert_eq!(status["requested"], serde_json::json!([]), "{status:#}");
    let decisions = status["autoscaler"]["decisions"].to_string();
    assert!(
        decisions.contains("terminating cpu-2-1: idle"),
        "{decisions}"
    );
}

/// Tasks that no node has room for wait for the autoscaler as spawns do:
/// their process counts them to the head, which lists them as pending
/// demands, and the nodes launched for them run them.
#[test]
fn tasks_wait_for_the_nodes_the_autoscaler_launches_for_them() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let config = config(dir.path(), "kind = \"local\"", 2);
    let _down = DownOnDrop(home.path(), &config);
    succeeds(home.path(), &["up", config.to_str().unwrap()]);

    let started = Instant::now();
    let out = run_example(
        home.path(),
        &[
            "--actors",
            "0",
            "--cpus",
            "2",
            "--tasks",
            "6",
            "--task-ms",
            "1500",
        ],
    );
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("tasks=6 task_nodes=2"), "{printed}");
    assert!(
        printed.contains("6 tasks (2 CPUs each) on cpu-2-1, cpu-2-2 after"),
        "{printed}"
    );
    println!(
        "tasks submitted to done: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    let status = status_until(home.path(), Duration::from_secs(10), |s| {
        s["pending"].as_array().unwrap().is_empty()
    });
    let decisions = status["autoscaler"]["decisions"].to_string();
    assert!(
        decisions.contains("launching cpu-2-1 (cpu-2) for")
            && decisions.contains("launching cpu-2-2 (cpu-2) for"),
        "{decisions}"
    );
}

/// A stand-in `kubectl` for the Kubernetes provider's test: it records its
/// arguments and each pod's manifest, runs a created pod's container
/// arguments as a process of this machine (`STAND_IN_NIMBUS` for the
/// image's `nimbus`, the pod IP 127.0.0.1, the token from the head's
/// `$NIMBUS_HOME/token` as the Secret would give it), and kills it when
/// the pod is deleted.
const STAND_IN_KUBECTL: &str = r#"#!/usr/bin/env python3
import json, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
args = sys.argv[1:]
with open(os.path.join(here, "kubectl.log"), "a") as log:
    log.write(" ".join(args) + "\n")
if args[-3:] == ["create", "-f", "-"]:
    pod = json.load(sys.stdin)
    name = pod["metadata"]["name"]
    with open(os.path.join(here, name + ".json"), "w") as kept:
        json.dump(pod, kept)
    container = pod["spec"]["containers"][0]
    argv = [os.environ["STAND_IN_NIMBUS"]]
    argv += [a.replace("$(POD_IP)", "127.0.0.1") for a in container["args"]]
    with open(os.path.join(os.environ["NIMBUS_HOME"], "token")) as token:
        env = dict(os.environ, NIMBUS_TOKEN=token.read().strip())
    child = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    with open(os.path.join(here, name + ".pid"), "w") as pid:
        pid.write(str(child.pid))
    print("pod/" + name + " created")
elif "delete" in args:
    name = args[args.index("pod") + 1]
    with open(os.path.join(here, name + ".pid")) as pid:
        os.kill(int(pid.read()), 15)
    print('pod "' + name + '" deleted')
else:
    sys.exit("stand-in kubectl: unexpected " + " ".join(args))
"#;

/// The Kubernetes provider creates a pod per node from the cluster's
/// image, its token from the Secret and its resources from its type, and
/// deletes it once idle (a stand-in `kubectl` runs the pod's container
/// here; the manifest itself is checked against the Kubernetes schemas by
/// `scripts/check-kubernetes.sh`).
#[test]
fn the_kubernetes_provider_creates_a_pod_per_node_and_deletes_it_when_idle() {
    let (home, dir) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let kubectl = bin.join("kubectl");
    std::fs::write(&kubectl, STAND_IN_KUBECTL).unwrap();
    std::fs::set_permissions(
        &kubectl,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let provider = format!(
        "kind = \"kubernetes\"\nnamespace = \"ml\"\nimage = \"nimbus:test\"\nkubectl = \"{}\"",
        kubectl.display()
    );
    let config = config(dir.path(), &provider, 2);
    let _down = DownOnDrop(home.path(), &config);
    let up = Command::new(env!("CARGO_BIN_EXE_nimbus"))
        .args(["up", config.to_str().unwrap()])
        .env("NIMBUS_HOME", home.path())
        .env("STAND_IN_NIMBUS", env!("CARGO_BIN_EXE_nimbus"))
        .env_remove("NIMBUS_TOKEN")
        .output()
        .unwrap();
    assert!(up.status.success(), "{}", text(&up));

    let out = run_example(
        home.path(),
        &["--actors", "1", "--cpus", "2", "--wait-s", "60"],
    );
    let printed = text(&out);
    assert!(out.status.success(), "{printed}");
    assert!(printed.contains("on cpu-2-1 after"), "{printed}");
    let pod: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bin.join("cpu-2-1.json")).unwrap()).unwrap();
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["image"], "nimbus:test");
    assert_eq!(container["resources"]["requests"]["cpu"], "2", "{pod:#}");
    assert_eq!(
        container["env"][0]["valueFrom"]["secretKeyRef"]["name"],
        "nimbus-token"
    );
    assert_eq!(pod["metadata"]["labels"]["nimbus.io/node-type"], "cpu-2");

    status_until(home.path(), Duration::from_secs(40), |s| {
        let cpu_2 = &s["autoscaler"]["node_types"][0];
        let log = std::fs::read_to_string(bin.join("kubectl.log")).unwrap_or_default();
        cpu_2["running"] == 0 && cpu_2["launching"] == 0 && log.contains("delete")
    });
    // Every pod created is deleted (usually one; see the Slurm test).
    let log = std::fs::read_to_string(bin.join("kubectl.log")).unwrap();
    let created = log
        .lines()
        .filter(|l| *l == "--namespace ml create -f -")
        .count();
    let deleted = log
        .lines()
        .filter(|l| l.starts_with("--namespace ml delete pod cpu-2-"))
        .filter(|l| l.ends_with(" --wait=false --ignore-not-found"))
        .count();
    assert!(created >= 1 && created == deleted, "{log}");
    assert!(
        log.contains("--namespace ml delete pod cpu-2-1 --wait=false --ignore-not-found"),
        "{log}"
    );
}
