//! Simulated hosts: separate machines on this one, for the paths that
//! cross hosts. Each host is
//! - a network namespace of its own, joined by a veth pair to a bridge in
//!   this (the root) namespace, with an address of its own on a /24 that
//!   only this test process uses;
//! - a mount namespace of its own, kept for the host's life (bound to a
//!   file, as `ip netns` keeps network namespaces) and entered by every
//!   process of the host, with a fresh tmpfs on `/dev/shm`: the processes
//!   of one host share it, and no shared-memory file of one host opens on
//!   another;
//! - a `NIMBUS_HOME` and `TMPDIR` of its own.
//!
//! The kernel (and its boot id) and the disk stay shared: a program is
//! found at the same path on every host, but nimbus ships it anyway (a
//! test hides the programs' directory on a host, as a test hides
//! libtorch's on another: `Host::private_dir`).
//!
//! Needs root and `ip netns` (both present on the development machine and
//! in CI). Elsewhere the tests that use it say so loudly and pass without
//! running. What it creates (namespaces, veths, the bridge: names with this
//! process's id and a number of their own) it deletes when dropped, and nothing else.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tempfile::TempDir;

use super::cli::text;
use super::dashboard::{example, line_value};
use super::not_run::cannot_run;

/// The port each host's head (when it runs one) listens on: every host
/// has all its ports free.
pub const HEAD_PORT: u16 = 7000;

/// One simulated host.
pub struct Host {
    namespace: String,
    /// Its veth's end on the bridge, once made.
    outside: Option<String>,
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its own `NIMBUS_HOME`.
    pub home: TempDir,
    tmp: TempDir,
    /// The file its mount namespace is bound to, once made.
    mounts: Option<std::path::PathBuf>,
}

impl Host {
    /// `program args` as a process of this host (its network and mount
    /// namespaces, its `NIMBUS_HOME` and `TMPDIR`).
    pub fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", self.namespace))
            .arg(format!(
                "--mount={}",
                self.mounts.as_deref().unwrap_or(Path::new("")).display()
            ))
            .arg("--")
            .arg(program)
            .args(args)
            .env("NIMBUS_HOME", self.home.path())
            .env("TMPDIR", self.tmp.path())
            .env_remove("NIMBUS_TOKEN")
            .env_remove("NIMBUS_ADDRESS");
        command
    }

    /// Gives this host a directory of its own at `path` (a tmpfs mounted
    /// there in its mount namespace): what other hosts see at that path
    /// is not what it sees, as with storage that is not shared.
    pub fn private_dir(&self, path: &Path) {
        let mounts = self.mounts.as_deref().unwrap().display().to_string();
        let path = path.to_str().unwrap();
        run(
            "nsenter",
            &[
                &format!("--mount={mounts}"),
                "--",
                "mount",
                "-t",
                "tmpfs",
                "nimbus-private",
                path,
            ],
        )
        .unwrap();
    }

    /// Shows this host the file `source` at `target` (a bind mount in its
    /// mount namespace): a file of its own where other hosts see another.
    pub fn bind_file(&self, source: &Path, target: &Path) {
        let mounts = self.mounts.as_deref().unwrap().display().to_string();
        run(
            "nsenter",
            &[
                &format!("--mount={mounts}"),
                "--",
                "mount",
                "--bind",
                source.to_str().unwrap(),
                target.to_str().unwrap(),
            ],
        )
        .unwrap();
    }

    /// Cuts this host off the network (its veth's end on the bridge goes
    /// down), or (`false`) connects it again.
    pub fn cut_off(&self, cut: bool) {
        let outside = self.outside.as_deref().unwrap();
        ip(&["link", "set", outside, if cut { "down" } else { "up" }]).unwrap();
    }

    /// Runs the `nimbus` CLI on this host with `env`; it must succeed.
    pub fn nimbus(&self, args: &[&str], env: &[(&str, &str)]) -> String {
        let out = self
            .command(Path::new(env!("CARGO_BIN_EXE_nimbus")), args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nimbus {args:?} on {}: {}",
            self.ip,
            text(&out)
        );
        text(&out)
    }

    /// Runs example `name` on this host against `head` with `token`.
    pub fn example(&self, name: &str, args: &[&str], head: &str, token: &str) -> Output {
        self.command(&example(name), &[&["--address", head], args].concat())
            .env("NIMBUS_TOKEN", token)
            .output()
            .unwrap()
    }
}

/// Hosts that exist until dropped.
pub struct Hosts {
    /// The bridge, once made.
    bridge: Option<String>,
    /// Where the hosts' mount namespaces are bound (a private mount of
    /// itself, as binding a namespace needs), once mounted.
    namespaces: Option<TempDir>,
    /// The hosts, in order.
    pub hosts: Vec<Host>,
}

impl Hosts {
    /// `count` hosts on a bridge of their own; `None` without root or
    /// `ip`, which fails the test unless not running is allowed
    /// (`not_run::cannot_run`).
    pub fn new(count: usize) -> Option<Hosts> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            cannot_run("simulated hosts need root");
            return None;
        }
        // Tests of one process run at once: each set of hosts has names
        // and a subnet of its own.
        static SETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let set = SETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let subnet = [10, 213, (pid.wrapping_add(set) % 250) as u8];
        let id = format!("{pid}-{set}");
        let mut hosts = Hosts {
            bridge: None,
            namespaces: None,
            hosts: Vec::new(),
        };
        if run("ip", &["-V"]).is_err() {
            cannot_run("simulated hosts need iproute2's ip");
            return None;
        }
        // As root with ip, hosts that cannot be made are a failure, not a
        // reason to skip.
        if let Err(e) = hosts.make(count, subnet, &id) {
            panic!("cannot make simulated hosts: {e}");
        }
        Some(hosts)
    }

    fn make(&mut self, count: usize, [a, b, c]: [u8; 3], id: &str) -> Result<(), String> {
        let namespaces = TempDir::new().map_err(|e| e.to_string())?;
        let dir = namespaces
            .path()
            .to_str()
            .ok_or("a temp dir named in UTF-8")?
            .to_string();
        run("mount", &["--bind", &dir, &dir])?;
        self.namespaces = Some(namespaces);
        run("mount", &["--make-private", &dir])?;
        let bridge = format!("nbr{id}");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        self.bridge = Some(bridge.clone());
        ip(&["addr", "add", &format!("{a}.{b}.{c}.1/24"), "dev", &bridge])?;
        ip(&["link", "set", &bridge, "up"])?;
        for i in 0..count {
            let namespace = format!("nimbus-{id}-{i}");
            let outside = format!("nv{id}-{i}");
            let inside = "eth0";
            let host_ip = Ipv4Addr::new(a, b, c, 10 + i as u8);
            ip(&["netns", "add", &namespace])?;
            self.hosts.push(Host {
                namespace: namespace.clone(),
                outside: None,
                ip: host_ip,
                home: TempDir::new().map_err(|e| e.to_string())?,
                tmp: TempDir::new().map_err(|e| e.to_string())?,
                mounts: None,
            });
            let mounts = format!("{dir}/mounts-{i}");
            std::fs::File::create(&mounts).map_err(|e| e.to_string())?;
            run(
                "unshare",
                &[
                    &format!("--mount={mounts}"),
                    "--propagation",
                    "private",
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    "size=1g",
                    "nimbus-shm",
                    "/dev/shm",
                ],
            )?;
            if let Some(host) = self.hosts.last_mut() {
                host.mounts = Some(mounts.into());
            }
            ip(&[
                "link", "add", &outside, "type", "veth", "peer", "name", inside, "netns",
                &namespace,
            ])?;
            if let Some(host) = self.hosts.last_mut() {
                host.outside = Some(outside.clone());
            }
            ip(&["link", "set", &outside, "master", &bridge, "up"])?;
            ip(&[
                "-n",
                &namespace,
                "addr",
                "add",
                &format!("{host_ip}/24"),
                "dev",
                inside,
            ])?;
            ip(&["-n", &namespace, "link", "set", inside, "up"])?;
            ip(&["-n", &namespace, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for host in &self.hosts {
            // Every node a host started, then the host.
            let _ = host
                .command(
                    Path::new(env!("CARGO_BIN_EXE_nimbus")),
                    &["stop", "--timeout-s", "5"],
                )
                .output();
            // Deleting one end of a veth pair deletes the pair (the
            // namespace would, but only once the kernel has reaped it).
            if let Some(outside) = &host.outside {
                let _ = ip(&["link", "del", outside]);
            }
            let _ = ip(&["netns", "del", &host.namespace]);
            // Its namespace's mounts (its /dev/shm, private directories)
            // go with the namespace once nothing holds it.
            if let Some(mounts) = &host.mounts {
                let _ = run("umount", &[mounts.to_str().unwrap_or_default()]);
            }
        }
        if let Some(namespaces) = &self.namespaces {
            let _ = run("umount", &[namespaces.path().to_str().unwrap_or_default()]);
        }
        if let Some(bridge) = &self.bridge {
            let _ = ip(&["link", "del", bridge]);
        }
    }
}

/// A cluster that [`Hosts::start_cluster`] started.
pub struct Cluster {
    /// The head's address.
    pub head: String,
    /// The cluster's token.
    pub token: String,
    /// What the head's `nimbus start` printed.
    pub printed: String,
    /// The members' node processes, in host order.
    pub member_pids: Vec<u32>,
}

impl Hosts {
    /// Starts a head on the first host (`head_flags` added) and a member
    /// `node-I` on host I for I in 1..=`members` (`member_flags` added),
    /// with the CLI.
    pub fn start_cluster(
        &self,
        members: usize,
        head_flags: &[&str],
        member_flags: &[&str],
    ) -> Cluster {
        self.start_cluster_with_env(members, head_flags, member_flags, &[])
    }

    /// [`start_cluster`](Self::start_cluster), every node started with
    /// `env` too (a fault plan's `node_env`).
    pub fn start_cluster_with_env(
        &self,
        members: usize,
        head_flags: &[&str],
        member_flags: &[&str],
        env: &[(&str, String)],
    ) -> Cluster {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let head_host = &self.hosts[0];
        let port = HEAD_PORT.to_string();
        let ip = head_host.ip.to_string();
        let start = [
            "start",
            "--head",
            "--port",
            &port,
            "--node-ip-address",
            &ip,
            "--no-dashboard",
        ];
        let printed = head_host.nimbus(&[&start[..], head_flags].concat(), &env);
        let head = line_value(&printed, "address:");
        let token = line_value(&printed, "token:");
        let mut member_pids = Vec::new();
        for (i, host) in self.hosts[1..=members].iter().enumerate() {
            let (ip, name) = (host.ip.to_string(), format!("node-{}", i + 1));
            let join = [
                "start",
                "--address",
                &head,
                "--node-ip-address",
                &ip,
                "--node-name",
                &name,
            ];
            let out = host.nimbus(
                &[&join[..], member_flags].concat(),
                &[&[("NIMBUS_TOKEN", token.as_str())], &env[..]].concat(),
            );
            member_pids.push(started_pid(&out));
        }
        Cluster {
            head,
            token,
            printed,
            member_pids,
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), text(&out)))
    }
}

#[test]
fn a_cluster_of_three_hosts_runs_actors_tasks_and_objects_across_them() {
    let Some(hosts) = Hosts::new(3) else { return };
    let [head_host, one, two] = &hosts.hosts[..] else {
        unreachable!()
    };
    let Cluster {
        head,
        token,
        printed: started,
        ..
    } = hosts.start_cluster(2, &[], &[]);
    assert_eq!(head, format!("{}:{HEAD_PORT}", head_host.ip), "{started}");
    let status = head_host.nimbus(&["status", "--json"], &[]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let nodes = status["nodes"].as_array().unwrap();
    let alive: Vec<&str> = nodes
        .iter()
        .filter(|n| n["state"] == "alive")
        .map(|n| n["address"].as_str().unwrap())
        .collect();
    assert_eq!(alive.len(), 3, "{status:#}");
    for host in [head_host, one, two] {
        assert!(
            alive
                .iter()
                .any(|a| a.starts_with(&format!("{}:", host.ip))),
            "{} is not among {alive:?}",
            host.ip
        );
    }

    // The programs' directory is empty on the head's host: the workers
    // that run there run binaries shipped to it, not found on a shared
    // disk.
    head_host.private_dir(example("tasks").parent().unwrap());

    // Actors on every host calling each other, one killed and restarted,
    // driven from a host without the head.
    let bank = two.example("custom_actor", &[], &head, &token);
    let printed = text(&bank);
    assert!(bank.status.success(), "custom_actor: {printed}");
    let summary = line_value(&printed, "summary:");
    assert!(
        summary.contains("nodes=3") && summary.contains("total_balance_ok=true"),
        "{summary}"
    );

    // Tasks and objects: results fetched across hosts, and a 64 MiB
    // object read by tasks on every host, where no shared-memory file of
    // another host opens.
    let tasks = one.example(
        "tasks",
        &["--tasks", "20", "--maps", "4", "--broadcast-mib", "64"],
        &head,
        &token,
    );
    let printed = text(&tasks);
    assert!(tasks.status.success(), "tasks: {printed}");
    let summary = line_value(&printed, "summary:");
    assert!(summary.contains("broadcast_mib=64"), "{summary}");
}

#[test]
fn training_spans_hosts_and_refuses_storage_they_do_not_share() {
    let Some(hosts) = Hosts::new(4) else { return };
    let [_, _, _, driver] = &hosts.hosts[..] else {
        unreachable!()
    };
    // One CPU per node: two workers of one CPU each land on two hosts.
    let Cluster { head, token, .. } =
        hosts.start_cluster(2, &["--num-cpus", "1"], &["--num-cpus", "1"]);
    let train = |storage: &Path| {
        driver.example(
            "train_mnist",
            &[
                "--workers",
                "2",
                "--epochs",
                "1",
                "--train-samples",
                "640",
                "--batch-size",
                "32",
                "--checkpoint-every",
                "5",
                "--storage",
                storage.to_str().unwrap(),
            ],
            &head,
            &token,
        )
    };

    // Storage every host shares (this machine's disk). The two ranks are
    // on two hosts (a CPU each, a CPU per node), where `Auto` picks the
    // network collective (shared memory would not open across their
    // /dev/shm); the run ends without a restart.
    let shared = TempDir::new().unwrap();
    let run = train(shared.path());
    let printed = text(&run);
    assert!(run.status.success(), "train_mnist: {printed}");
    let summary = line_value(&printed, "summary:");
    assert!(summary.contains("restarts=0"), "{summary}");

    // Storage only the driver's host sees (a directory of its own there):
    // the first checkpoint fails the run, saying why.
    let unshared = TempDir::new().unwrap();
    driver.private_dir(unshared.path());
    let run = train(unshared.path());
    let printed = text(&run);
    assert!(!run.status.success(), "train_mnist succeeded: {printed}");
    assert!(
        printed.contains("storage_path must be a directory that every node and the driver share"),
        "{printed}"
    );
}

/// The pid `nimbus start` printed for the node it left in the background.
fn started_pid(printed: &str) -> u32 {
    printed
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in:\n{printed}"))
}

#[test]
fn a_host_cut_off_is_declared_dead_and_its_node_refused_when_it_returns() {
    use nimbus::client::ClusterClient;
    use nimbus::cluster::NodeState;

    let Some(hosts) = Hosts::new(3) else { return };
    let [_, one, _] = &hosts.hosts[..] else {
        unreachable!()
    };
    let Cluster {
        head,
        token,
        member_pids: pids,
        ..
    } = hosts.start_cluster(2, &["--heartbeat-timeout-ms", "1000"], &[]);
    let state = |status: &nimbus::cluster::ClusterStatus, name: &str| {
        status.node(name).map(|node| node.state)
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = ClusterClient::connect(&head, &token.parse().unwrap())
            .await
            .unwrap();
        one.cut_off(true);
        let status = client
            .wait_for_status("node-1 declared dead", Duration::from_secs(30), |s| {
                state(s, "node-1") == Some(NodeState::Dead)
            })
            .await
            .unwrap();
        assert_eq!(state(&status, "node-2"), Some(NodeState::Alive));
        // Back on the network, the dead incarnation is refused and its
        // node process exits.
        one.cut_off(false);
        nimbus::testing::ExitWatch::of(&pids[..1])
            .wait(Duration::from_secs(30))
            .unwrap();
        let status = client.status().await.unwrap();
        assert_eq!(state(&status, "node-1"), Some(NodeState::Dead));
        assert_eq!(state(&status, "node-2"), Some(NodeState::Alive));
    });
}

/// The directory of the libtorch `program` loads (from `ldd`).
fn libtorch_dir(program: &Path) -> PathBuf {
    let listed = super::libraries::libraries(program);
    let library = listed
        .lines()
        .find_map(|line| line.trim().strip_prefix("libtorch_cpu.so => "))
        .and_then(|rest| rest.split(" (").next())
        .unwrap_or_else(|| panic!("{} loads no libtorch_cpu.so:\n{listed}", program.display()));
    Path::new(library).parent().unwrap().to_path_buf()
}

/// A host that lacks the libtorch a training program was built against
/// (its directory empty there): the node daemon runs there all the same
/// (it links no libtorch), and refuses to start the program's worker,
/// naming itself and the libraries, which the run's error then shows —
/// rather than a worker dying in the dynamic loader with the reason in a
/// log on that host.
#[test]
fn a_host_without_libtorch_refuses_training_workers_naming_the_libraries() {
    let Some(hosts) = Hosts::new(3) else { return };
    let [_, member, driver] = &hosts.hosts[..] else {
        unreachable!()
    };
    member.private_dir(&libtorch_dir(&example("train_mnist")));
    // The head offers no CPU: the one worker can only go to the member.
    let Cluster { head, token, .. } =
        hosts.start_cluster(1, &["--num-cpus", "0"], &["--num-cpus", "1"]);
    let run = driver.example(
        "train_mnist",
        &[
            "--workers",
            "1",
            "--epochs",
            "1",
            "--train-samples",
            "64",
            "--max-failures",
            "0",
        ],
        &head,
        &token,
    );
    let printed = text(&run);
    assert!(!run.status.success(), "train_mnist succeeded: {printed}");
    assert!(
        printed.contains("node node-1 cannot run the program")
            && printed.contains("libraries not found: libtorch_cpu.so"),
        "{printed}"
    );
}

/// A member host whose torch says it is another release (its
/// `version.py`; the libraries are the same, so only the release check
/// can tell): its worker refuses to train, and the run stops at once,
/// naming the rank, the node and both releases, rather than training with
/// two libtorch releases in one group; `nimbus job list` shows the
/// driver's libtorch.
#[test]
fn a_host_with_another_libtorch_release_refuses_training_naming_both() {
    let Some(hosts) = Hosts::new(3) else { return };
    let [head_host, member, driver] = &hosts.hosts[..] else {
        unreachable!()
    };
    let torch = libtorch_dir(&example("train_mnist")).join("..");
    let Ok(ours) = std::fs::read_to_string(torch.join("version.py")) else {
        eprintln!(
            "SKIPPED: {} is not a torch package (no version.py); this test rewrites a package's release",
            torch.display()
        );
        return;
    };
    let release = ours
        .lines()
        .find_map(|line| line.strip_prefix("__version__ = '"))
        .and_then(|rest| rest.strip_suffix('\''))
        .unwrap_or_else(|| panic!("no __version__ in {}:\n{ours}", torch.display()));
    let another = format!("9.{release}");
    let theirs = TempDir::new().unwrap();
    let version_py = theirs.path().join("version.py");
    std::fs::write(&version_py, ours.replace(release, &another)).unwrap();
    member.bind_file(&version_py, &torch.join("version.py"));
    // The head offers no CPU: the one worker can only go to the member.
    let Cluster { head, token, .. } =
        hosts.start_cluster(1, &["--num-cpus", "0"], &["--num-cpus", "1"]);
    let run = driver.example(
        "train_mnist",
        &[
            "--workers",
            "1",
            "--epochs",
            "1",
            "--train-samples",
            "64",
            "--max-failures",
            "3",
        ],
        &head,
        &token,
    );
    let printed = text(&run);
    assert!(!run.status.success(), "train_mnist succeeded: {printed}");
    assert!(
        printed.contains(&format!(
            "worker rank 0 on node node-1 loaded libtorch {another}"
        )) && printed.contains(&format!("and the driver libtorch {release}")),
        "{printed}"
    );
    assert!(
        !printed.contains("times (max_failures"),
        "a release mismatch is not retried: {printed}"
    );
    let jobs = head_host.nimbus(&["job", "list", "--json"], &[("NIMBUS_TOKEN", &token)]);
    assert!(jobs.contains(&format!("libtorch {release}")), "{jobs}");
}

/// The container image's runtime layout (`scripts/image-runtime.sh`, the
/// steps the Dockerfile runs) on a host that lacks the build's libtorch:
/// the CLI and a training program run from it with only its `lib/` on
/// `LD_LIBRARY_PATH`, a local cluster and a worker included.
#[test]
fn the_image_layout_trains_on_a_host_without_the_builds_libtorch() {
    let Some(hosts) = Hosts::new(1) else { return };
    let host = &hosts.hosts[0];
    let build = Path::new(env!("CARGO_BIN_EXE_nimbus")).parent().unwrap();
    let prefix = TempDir::new().unwrap();
    let layout = prefix.path().join("nimbus");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/image-runtime.sh");
    let laid = Command::new(&script)
        .arg(&layout)
        .arg(build)
        .output()
        .unwrap();
    assert!(laid.status.success(), "{}", text(&laid));
    let stated = ["version.py", "build-version"]
        .iter()
        .find_map(|name| std::fs::read_to_string(layout.join(name)).ok());
    assert!(
        stated.is_some_and(|text| text.contains('.')),
        "the layout states its libtorch's release"
    );
    host.private_dir(&libtorch_dir(&example("train_mnist")));
    let lib = layout.join("lib");
    let train = |with_lib: bool| {
        let mut command = host.command(
            &layout.join("bin/train_mnist"),
            &["--workers", "1", "--epochs", "1", "--train-samples", "64"],
        );
        command
            .env_remove("NIMBUS_BIN")
            .env_remove("LD_LIBRARY_PATH");
        if with_lib {
            command.env("LD_LIBRARY_PATH", &lib);
        }
        command.output().unwrap()
    };
    // Without the layout's lib/, the build's libtorch is not there.
    let bare = train(false);
    assert!(!bare.status.success(), "{}", text(&bare));
    assert!(text(&bare).contains("libtorch_cpu.so"), "{}", text(&bare));
    let run = train(true);
    let printed = text(&run);
    assert!(run.status.success(), "train_mnist: {printed}");
    assert!(
        line_value(&printed, "summary:").contains("restarts=0"),
        "{printed}"
    );
}

/// The Slurm launcher's logic (`scripts/slurm/nimbus-slurm.sh`, what
/// `nimbus.sbatch` runs on each node and then once) with the `SLURM_*`
/// variables of a three-node job on three simulated hosts: the head
/// starts on the first host and the members join it; the program runs
/// once every node is alive; SIGTERM (what srun sends when the batch
/// script ends) stops every node, and the head's step removes the token
/// and the job's directory it made.
#[test]
fn the_slurm_launcher_runs_a_program_on_a_cluster_over_the_jobs_hosts() {
    let Some(hosts) = Hosts::new(3) else { return };
    let shared = TempDir::new().unwrap();
    let nodelist: Vec<String> = hosts.hosts.iter().map(|h| h.ip.to_string()).collect();
    let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/slurm/nimbus-slurm.sh");
    let slurm = |node: usize, args: &[&str]| {
        let mut command = hosts.hosts[node].command(
            Path::new("bash"),
            &[&[launcher.to_str().unwrap()], args].concat(),
        );
        command
            .env("SLURM_JOB_NODELIST", nodelist.join(","))
            .env("SLURM_NODEID", node.to_string())
            .env("SLURM_JOB_NUM_NODES", "3")
            .env("SLURM_JOB_ID", "17")
            .env("NIMBUS_SLURM_DIR", shared.path())
            .env("NIMBUS_SLURM_WAIT", "60")
            .env("NIMBUS", env!("CARGO_BIN_EXE_nimbus"));
        command
    };
    let mut nodes = SlurmNodes(
        (0..3)
            .map(|node| {
                slurm(node, &["node"])
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let tasks = example("tasks");
    let run = slurm(0, &["run", tasks.to_str().unwrap()])
        .output()
        .unwrap();
    let printed = text(&run);
    assert!(run.status.success(), "tasks: {printed}");
    assert!(printed.contains("summary:"), "{printed}");

    let head = format!("{}:6379", nodelist[0]);
    let token = std::fs::read_to_string(shared.path().join(".nimbus-slurm-17/token")).unwrap();
    let status = hosts.hosts[0]
        .command(
            Path::new(env!("CARGO_BIN_EXE_nimbus")),
            &["status", "--json", "--address", &head],
        )
        .env("NIMBUS_TOKEN", token.trim())
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", text(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let names: Vec<&str> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["state"] == "alive")
        .map(|node| node["id"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"slurm-1") && names.contains(&"slurm-2") && names.len() == 3,
        "{status}"
    );

    nodes.stop().unwrap();
    let job_dir = shared.path().join(".nimbus-slurm-17");
    assert!(
        !job_dir.exists(),
        "the stopped head leaves no token behind: {:?}",
        std::fs::read_dir(&job_dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
}

/// The launcher's `node` processes: stopped as srun stops them, by the
/// test or, if it fails first, when dropped (before the hosts go).
struct SlurmNodes(Vec<std::process::Child>);

impl SlurmNodes {
    /// SIGTERM to each (what srun sends when the batch script ends), then
    /// waits up to 30 s for every one to exit; one still there is killed.
    fn stop(&mut self) -> Result<(), nimbus::testing::LeftBehind> {
        let pids: Vec<u32> = self.0.iter().map(|node| node.id()).collect();
        for pid in &pids {
            // SAFETY: kill has no memory preconditions; the pids are our
            // children, not yet reaped.
            unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
        }
        let exited = nimbus::testing::ExitWatch::of(&pids).wait(Duration::from_secs(30));
        for mut node in self.0.drain(..) {
            if exited.is_err() {
                let _ = node.kill();
            }
            let _ = node.wait();
        }
        exited
    }
}

impl Drop for SlurmNodes {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = self.stop();
        }
    }
}

/// The MNIST fault plan (`examples/faults/mnist.toml`: a straggler, a
/// checkpoint write failing with a full disk, a rank hung inside the
/// collective, a rank's worker killed) with the ranks on hosts of their
/// own, averaging over the network collective: the run restarts three
/// times and ends on the parameters of the same run without the plan.
#[test]
fn the_mnist_fault_plan_across_hosts_ends_on_the_fault_free_parameters() {
    mnist_plan_across_hosts("mnist.toml", "3");
}

/// The MNIST node-loss plan (`examples/faults/mnist_nodes.toml`: rank 1's
/// worker kills its node at a step): the host's node is gone, the group
/// restarts once on the hosts left and ends on the fault-free parameters.
#[test]
fn the_mnist_node_loss_plan_across_hosts_ends_on_the_fault_free_parameters() {
    mnist_plan_across_hosts("mnist_nodes.toml", "1");
}

/// Runs the MNIST example with two ranks on a cluster of a head (no CPU:
/// never a rank, so the plan cannot kill the head) and three members of
/// one CPU each, each on a host of its own, driven from a fifth host:
/// without `plan`, then under its training faults. The second run makes
/// `restarts` restarts and ends on the first's parameters.
fn mnist_plan_across_hosts(plan: &str, restarts: &str) {
    let Some(hosts) = Hosts::new(5) else { return };
    let driver = &hosts.hosts[4];
    let plan = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/faults")
        .join(plan);
    let plan =
        nimbus::chaos::ChaosPlan::from_toml(&std::fs::read_to_string(plan).unwrap()).unwrap();
    // The plan's node environment lets its kill_node faults signal nodes.
    let Cluster { head, token, .. } = hosts.start_cluster_with_env(
        3,
        &["--num-cpus", "0"],
        &["--num-cpus", "1"],
        &plan.node_env(),
    );
    let storage = TempDir::new().unwrap();
    let train = |faults: &[(&'static str, String)]| {
        let out = driver
            .command(
                &example("train_mnist"),
                &[
                    "--address",
                    &head,
                    "--workers",
                    "2",
                    "--epochs",
                    "1",
                    "--checkpoint-every",
                    "10",
                    "--storage",
                    storage.path().to_str().unwrap(),
                ],
            )
            .env("NIMBUS_TOKEN", &token)
            .envs(faults.iter().map(|(name, value)| (name, value)))
            .output()
            .unwrap();
        let printed = text(&out);
        assert!(out.status.success(), "train_mnist: {printed}");
        line_value(&printed, "summary:")
    };
    let clean = train(&[]);
    let faulted = train(&plan.workload_env());
    let value = |summary: &str, key: &str| {
        summary
            .split_whitespace()
            .find_map(|pair| pair.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("no {key} in {summary}"))
            .to_string()
    };
    assert_eq!(value(&clean, "restarts"), "0", "{clean}");
    assert_eq!(value(&faulted, "restarts"), restarts, "{faulted}");
    assert_eq!(
        value(&clean, "params_sha256"),
        value(&faulted, "params_sha256"),
        "{clean}\n{faulted}"
    );
}

/// The bank of `examples/custom_actor.rs` across hosts: the ledger on the
/// head's host, the accounts spread over two member hosts, the driver on
/// a fourth, under `bank.toml` (an account killed, one panicking, the
/// driver's datagrams dropped and cut off for a second). Every
/// acknowledged transfer is applied exactly once, and the plan's actor
/// faults fired: account-2 and account-3 restarted once each (the bank
/// itself kills only account-1).
#[test]
fn the_bank_balances_across_hosts_under_its_fault_plan() {
    bank_plan_across_hosts("bank.toml", 3, &[("account-2", 1), ("account-3", 1)]);
}

/// The bank across hosts under `bank_nodes.toml`'s node loss: the node of
/// account-1's host is SIGKILLed at its 20th transfer, and its accounts
/// restart on the other member host. (The plan's timed partition, stall
/// and lossy links are driven by `nimbus chaos run` on its own local
/// cluster; a host cut off is `a_host_cut_off_is_declared_dead...`.)
/// The node loss fired: two nodes are left, and account-1 restarted twice
/// (the bank's own kill, and its node's).
#[test]
fn the_bank_balances_across_hosts_when_a_host_loses_its_node() {
    bank_plan_across_hosts("bank_nodes.toml", 2, &[("account-1", 2)]);
}

/// Runs the bank against a cluster of three hosts started with `plan`'s
/// node faults; `nodes` are alive at its end, and each of `restarted`
/// (an account's name, how many restarts) restarted that often.
fn bank_plan_across_hosts(plan: &str, nodes: usize, restarted: &[(&str, u64)]) {
    let Some(hosts) = Hosts::new(4) else { return };
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/faults")
        .join(plan);
    let plan =
        nimbus::chaos::ChaosPlan::from_toml(&std::fs::read_to_string(path).unwrap()).unwrap();
    let Cluster { head, token, .. } = hosts.start_cluster_with_env(
        2,
        &["--num-cpus", "1"],
        &["--num-cpus", "2"],
        &plan.node_env(),
    );
    let out = hosts.hosts[3]
        .command(&example("custom_actor"), &["--address", &head])
        .env("NIMBUS_TOKEN", &token)
        .envs(plan.workload_env())
        .output()
        .unwrap();
    let printed = text(&out);
    assert!(out.status.success(), "custom_actor: {printed}");
    let summary = line_value(&printed, "summary:");
    assert!(
        summary.contains(&format!("nodes={nodes} ")) && summary.contains("total_balance_ok=true"),
        "{printed}"
    );
    let list = ["list", "actors", "--json", "--address", &head];
    let listed = hosts.hosts[3]
        .command(Path::new(env!("CARGO_BIN_EXE_nimbus")), &list)
        .env("NIMBUS_TOKEN", &token)
        .output()
        .unwrap();
    assert!(listed.status.success(), "nimbus list: {}", text(&listed));
    let listed = String::from_utf8_lossy(&listed.stdout).to_string();
    let actors: serde_json::Value = serde_json::from_str(&listed).unwrap();
    for (name, restarts) in restarted {
        let actor = actors
            .as_array()
            .and_then(|rows| rows.iter().find(|row| row["name"] == *name))
            .unwrap_or_else(|| panic!("no {name} in {listed}"));
        assert_eq!(
            actor["restarts"].as_u64(),
            Some(*restarts),
            "{name}'s restarts, the plan's faults: {actor}\n{printed}"
        );
    }
}
