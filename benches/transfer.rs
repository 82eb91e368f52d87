//! Objects between nodes: a node pulls 256 MiB objects from the head, over
//! its bulk stream (TLS over TCP, `transport/bulk.rs`) and over QUIC (both
//! nodes started with `--no-tcp-transfers`), in one run:
//!
//! - `cross_node_loopback_{tcp,quic}_gb_per_s`: both nodes on 127.0.0.1;
//! - `cross_node_veth_{tcp,quic}_gb_per_s`: the pulling node in a network
//!   namespace of its own, joined to this one by a veth pair (a second
//!   host as far as the network goes; `/dev/shm` stays shared, which a
//!   pull between nodes does not use). Needs root and `ip`; elsewhere the
//!   bench says so and measures loopback only.
//!
//! - `floor_{loopback,veth}_{first_,}gb_per_s`: the same work done by a
//!   plain program, one thread per end (`floor` below), and
//!   `cross_node_*_tcp_{first_,}of_floor`: nimbus's figure over it. The
//!   plain program reads 1 MiB at a time where nimbus reads 256 KiB, so
//!   nimbus can come out above it; on the 2-core development machine
//!   both move by a quarter between runs (a fresh page is sometimes slow
//!   to come from the VM's host).
//!
//! Each pull's path is checked in the pulling node's log. Each figure is
//! the median of six pulls, each into a file freed by the
//! pull before (the store reuses it); `..._first_gb_per_s` is the first
//! pull, into a fresh file whose pages the kernel allocates (what
//! `make run EXAMPLE=microbench` reports as `cross_node_gb_per_s`).
//!
//! ```text
//! cargo build --release --bin nimbus && cargo bench --bench transfer
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it makes one
//! pull of 8 MiB on loopback each way: a smoke test. The nodes' homes are
//! temporary directories; the namespace and the veth pair carry this
//! process's id and are deleted at the end, as are the nodes.

// Benchmarks: a failed unwrap is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nimbus::cluster::{MembershipReply, MembershipRequest, ObjectReply, ObjectRequest};
use nimbus::object_store;
use nimbus::transport::RequestOptions;

/// How long the pulling node may take to join.
const JOIN_WAIT: Duration = Duration::from_secs(20);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--driver") {
        let pulls = args[at + 1].parse().unwrap();
        let mib = args[at + 2].parse().unwrap();
        return driver(pulls, mib);
    }
    if let Some(at) = args.iter().position(|a| a == "--floor-receiver") {
        let pulls = args[at + 2].parse().unwrap();
        let mib = args[at + 3].parse().unwrap();
        return floor::receive(&args[at + 1], pulls, mib, Path::new(&args[at + 4]));
    }
    let full = args.iter().any(|a| a == "--bench");
    let (pulls, mib) = if full { (7, 256) } else { (1, 8) };
    let program = nimbus_program();
    let mut nets = vec![Net::Loopback];
    match (full, Veth::create()) {
        (true, Ok(veth)) => nets.push(Net::Veth(veth)),
        (true, Err(e)) => println!("# no veth figures: {e}"),
        (false, _) => {}
    }
    for net in &nets {
        let mut tcp = (0.0, None);
        for path in ["tcp", "quic"] {
            let speeds = measure(&program, net, path == "quic", pulls, mib);
            let figures = report(&format!("cross_node_{}_{path}", net.name()), &speeds);
            if path == "tcp" {
                tcp = figures;
            }
        }
        let floor = floor::measure(net, pulls, mib);
        let (first, rest) = report(&format!("floor_{}", net.name()), &floor);
        println!(
            "cross_node_{}_tcp_first_of_floor: {:.2} x",
            net.name(),
            tcp.0 / first
        );
        if let (Some(tcp), Some(rest)) = (tcp.1, rest) {
            println!(
                "cross_node_{}_tcp_of_floor: {:.2} x",
                net.name(),
                tcp / rest
            );
        }
    }
}

/// Prints the first pull's figure and the median of the others under
/// `name`; both.
fn report(name: &str, speeds: &[f64]) -> (f64, Option<f64>) {
    println!("{name}_first_gb_per_s: {:.2} GB/s", speeds[0]);
    let mut rest = speeds[1..].to_vec();
    if rest.is_empty() {
        return (speeds[0], None);
    }
    rest.sort_by(f64::total_cmp);
    let median = rest[rest.len() / 2];
    println!("{name}_gb_per_s: {median:.2} GB/s");
    (speeds[0], Some(median))
}

/// The `nimbus` binary: `$NIMBUS_BIN`, else the one beside this bench.
fn nimbus_program() -> PathBuf {
    if let Some(program) = std::env::var_os("NIMBUS_BIN") {
        return program.into();
    }
    let exe = std::env::current_exe().unwrap();
    let beside = exe.parent().unwrap().parent().unwrap().join("nimbus");
    assert!(
        beside.exists(),
        "no nimbus binary at {}; build it (cargo build --release --bin nimbus) or set NIMBUS_BIN",
        beside.display()
    );
    beside
}

/// Where the pulling node runs.
enum Net {
    Loopback,
    Veth(Veth),
}

impl Net {
    fn name(&self) -> &'static str {
        match self {
            Net::Loopback => "loopback",
            Net::Veth(_) => "veth",
        }
    }

    /// The head's address and the pulling node's.
    fn addresses(&self) -> (String, String) {
        match self {
            Net::Loopback => ("127.0.0.1".into(), "127.0.0.1".into()),
            Net::Veth(veth) => (veth.ours.clone(), veth.theirs.clone()),
        }
    }

    /// A command run where the pulling node lives.
    fn command(&self, program: &Path) -> Command {
        match self {
            Net::Loopback => Command::new(program),
            Net::Veth(veth) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", &veth.namespace])
                    .arg(program);
                command
            }
        }
    }
}

/// A network namespace joined to this one by a veth pair.
struct Veth {
    namespace: String,
    link: String,
    ours: String,
    theirs: String,
}

impl Veth {
    fn create() -> Result<Self, String> {
        let pid = std::process::id();
        let subnet = format!("10.214.{}", pid % 250);
        let veth = Veth {
            namespace: format!("nbx{pid}"),
            link: format!("nbx{pid}a"),
            ours: format!("{subnet}.1"),
            theirs: format!("{subnet}.2"),
        };
        let peer = format!("nbx{pid}b");
        let (ns, link) = (veth.namespace.as_str(), veth.link.as_str());
        let ours = format!("{}/24", veth.ours);
        let theirs = format!("{}/24", veth.theirs);
        let steps: [&[&str]; 8] = [
            &["netns", "add", ns],
            &["link", "add", link, "type", "veth", "peer", "name", &peer],
            &["link", "set", &peer, "netns", ns],
            &["addr", "add", &ours, "dev", link],
            &["link", "set", link, "up"],
            &["-n", ns, "addr", "add", &theirs, "dev", &peer],
            &["-n", ns, "link", "set", &peer, "up"],
            &["-n", ns, "link", "set", "lo", "up"],
        ];
        for step in steps {
            let out = Command::new("ip").args(step).output();
            match out {
                Ok(out) if out.status.success() => {}
                Ok(out) => {
                    return Err(format!(
                        "ip {}: {}",
                        step.join(" "),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ))
                }
                Err(e) => return Err(format!("cannot run ip: {e}")),
            }
        }
        Ok(veth)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.namespace])
            .status();
    }
}

/// A node started with `nimbus start`, stopped when dropped.
struct Node {
    program: PathBuf,
    home: tempfile::TempDir,
    token: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = Command::new(&self.program)
            .arg("stop")
            .env("NIMBUS_HOME", self.home.path())
            .env("NIMBUS_TOKEN", &self.token)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The GB/s of each pull, the first into a fresh file.
fn measure(program: &Path, net: &Net, quic: bool, pulls: usize, mib: usize) -> Vec<f64> {
    let (head_ip, node_ip) = net.addresses();
    let only_quic: &[&str] = if quic { &["--no-tcp-transfers"] } else { &[] };
    let home = tempfile::tempdir().unwrap();
    let head_args = [
        "start",
        "--head",
        "--port",
        "0",
        "--node-ip-address",
        &head_ip,
        "--no-dashboard",
    ];
    let out = Command::new(program)
        .args(head_args)
        .args(only_quic)
        .env("NIMBUS_HOME", home.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "the head did not start: {printed}");
    let token = printed
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("the head prints its token")
        .to_string();
    let address = printed
        .lines()
        .find_map(|l| l.strip_prefix("address: "))
        .expect("the head prints its address")
        .to_string();
    let head = Node {
        program: program.into(),
        home,
        token: token.clone(),
    };
    let node_home = tempfile::tempdir().unwrap();
    let node_args = [
        "start",
        "--address",
        &address,
        "--node-ip-address",
        &node_ip,
        "--node-name",
        "node-1",
    ];
    let out = net
        .command(program)
        .args(node_args)
        .args(only_quic)
        .env("NIMBUS_HOME", node_home.path())
        .env("NIMBUS_TOKEN", &token)
        .env("NIMBUS_LOG", "info,nimbus::object_store::node=debug")
        .output()
        .unwrap();
    let node_log = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("log: "))
        .map(PathBuf::from);
    let node = Node {
        program: program.into(),
        home: node_home,
        token: token.clone(),
    };
    assert!(
        out.status.success(),
        "node-1 did not start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--driver", &pulls.to_string(), &mib.to_string()])
        .env("NIMBUS_ADDRESS", &address)
        .env("NIMBUS_TOKEN", &token)
        .env("NIMBUS_HOME", head.home.path())
        .env("NIMBUS_BIN", program)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "the driver failed: {printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each pull's path, from node-1's log: a silent fallback to QUIC
    // must not pass for a TCP figure.
    let log = node_log.expect("node-1 prints its log");
    let log = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    drop(node);
    drop(head);
    let want = if quic {
        " over quic in "
    } else {
        " over tcp in "
    };
    let took = log.lines().filter(|l| l.contains(want)).count();
    assert_eq!(took, pulls, "pulls over{want}in node-1's log:\n{log}");
    printed
        .lines()
        .filter_map(|l| l.strip_prefix("pull_gb_per_s: "))
        .map(|v| v.parse().unwrap())
        .collect()
}

/// The driver (this bench re-run with `--driver PULLS MIB`): puts an
/// object at the head, has node-1 pull it, drops it, `pulls` times.
fn driver(pulls: usize, mib: usize) {
    let driver = nimbus::init_with(
        nimbus::actor::Registry::new(),
        nimbus::InitOptions::default(),
    )
    .unwrap();
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let context = nimbus::actor::ProcessContext::current().expect("connected");
        let status = MembershipRequest::Status;
        let deadline = Instant::now() + JOIN_WAIT;
        let node = loop {
            if let MembershipReply::Status(status) =
                context.call_head(status.clone()).await.unwrap()
            {
                if let Some(node) = status.node("node-1") {
                    break node.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "node-1 did not join within {JOIN_WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let connection = context
            .endpoint
            .connect(node.address, Some(&node.identity()))
            .await
            .unwrap();
        let size = mib << 20;
        for _ in 0..pulls {
            let object = object_store::put_bytes(&vec![0xa5u8; size]).await.unwrap();
            let pull = ObjectRequest::PullObject {
                id: object.id(),
                owner: object.owner().clone(),
                wait_ms: 0,
            };
            let started = Instant::now();
            let reply = nimbus::client::call(&connection, pull, RequestOptions::bulk()).await;
            let elapsed = started.elapsed();
            match reply {
                Ok(ObjectReply::Ready { size: got, .. }) if got == size as u64 => {}
                other => panic!("node-1 did not pull the object: {other:?}"),
            }
            println!(
                "pull_gb_per_s: {:.3}",
                size as f64 / elapsed.as_secs_f64() / 1e9
            );
        }
    });
}

/// The floor under a pull over a bulk stream (`floor_{loopback,veth}_*`):
/// the same work with nothing else. One thread per end over a blocking
/// TCP socket: the sender reads a tmpfs file a MiB at a time straight
/// into 16 KiB records (`preadv`), seals them with AES-256-GCM (the cipher
/// the bulk streams' TLS agrees on) and writes them; the receiver (this
/// bench re-run with `--floor-receiver`, where the pulling node runs)
/// reads them, opens them in place and writes their bytes into a tmpfs
/// file (`pwritev`): a fresh file first, then the same file again, as
/// nimbus's pulls after the first reuse a freed one. No handshake, no
/// headers, no requests; a one-byte answer ends each pull.
mod floor {
    use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::path::Path;
    use std::process::{Child, Stdio};
    use std::time::{Duration, Instant};

    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

    use super::Net;

    /// Bytes a record carries, and its tag.
    const RECORD: usize = 16 << 10;
    const TAG: usize = 16;
    /// Bytes read, sealed and written at a time.
    const CHUNK: usize = 1 << 20;
    /// The longest any socket call waits.
    const STALL: Duration = Duration::from_secs(30);

    /// The key both ends use: a floor needs no secret.
    fn key() -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7; 32]).unwrap())
    }

    fn nonce(seq: &mut u64) -> Nonce {
        let mut nonce = [0; 12];
        nonce[4..].copy_from_slice(&seq.to_be_bytes());
        *seq += 1;
        Nonce::assume_unique_for_key(nonce)
    }

    /// The receiver, killed if still running when dropped.
    struct Receiver(Child);

    impl Drop for Receiver {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The GB/s of each of `pulls` transfers of `mib` MiB to where `net`
    /// puts the pulling node.
    pub(super) fn measure(net: &Net, pulls: usize, mib: usize) -> Vec<f64> {
        let shm = Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            tempfile::tempdir_in(shm).unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let size = mib << 20;
        let source = dir.path().join("source");
        let bytes: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        std::fs::write(&source, &bytes).unwrap();
        drop(bytes);
        let (_, ip) = net.addresses();
        let mut receiver = Receiver(
            net.command(&std::env::current_exe().unwrap())
                .arg("--floor-receiver")
                .arg(&ip)
                .args([pulls.to_string(), mib.to_string()])
                .arg(dir.path())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let mut port = String::new();
        BufReader::new(receiver.0.stdout.take().unwrap())
            .read_line(&mut port)
            .unwrap();
        let port: u16 = port.trim().parse().expect("the receiver prints its port");
        let mut tcp = TcpStream::connect((ip.as_str(), port)).unwrap();
        tcp.set_read_timeout(Some(STALL)).unwrap();
        tcp.set_write_timeout(Some(STALL)).unwrap();
        let file = std::fs::File::open(&source).unwrap();
        let key = key();
        let mut seq = 0;
        let mut wire = vec![0; CHUNK / RECORD * (RECORD + TAG)];
        let mut speeds = Vec::new();
        for _ in 0..pulls {
            let started = Instant::now();
            for at in (0..size).step_by(CHUNK) {
                let mut slots: Vec<_> = wire
                    .chunks_mut(RECORD + TAG)
                    .map(|record| IoSliceMut::new(&mut record[..RECORD]))
                    .collect();
                let read = rustix::io::preadv(&file, &mut slots, at as u64).unwrap();
                assert_eq!(read, CHUNK, "a short read of the source");
                for record in wire.chunks_mut(RECORD + TAG) {
                    let (body, tag) = record.split_at_mut(RECORD);
                    let sealed = key
                        .seal_in_place_separate_tag(nonce(&mut seq), Aad::empty(), body)
                        .unwrap();
                    tag.copy_from_slice(sealed.as_ref());
                }
                tcp.write_all(&wire).unwrap();
            }
            tcp.read_exact(&mut [0]).unwrap();
            speeds.push(size as f64 / started.elapsed().as_secs_f64() / 1e9);
        }
        assert!(receiver.0.wait().unwrap().success(), "the receiver failed");
        speeds
    }

    /// The receiving end (`--floor-receiver IP PULLS MIB DIR`): prints its
    /// port, then takes `pulls` transfers into `DIR/received`.
    pub(super) fn receive(ip: &str, pulls: usize, mib: usize, dir: &Path) {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        println!("{}", listener.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        let (mut tcp, _) = listener.accept().unwrap();
        tcp.set_read_timeout(Some(STALL)).unwrap();
        tcp.set_write_timeout(Some(STALL)).unwrap();
        let file = std::fs::File::create(dir.join("received")).unwrap();
        let key = key();
        let mut seq = 0;
        let mut wire = vec![0; CHUNK / RECORD * (RECORD + TAG)];
        for _ in 0..pulls {
            for at in (0..mib << 20).step_by(CHUNK) {
                tcp.read_exact(&mut wire).unwrap();
                let bodies: Vec<_> = wire
                    .chunks_mut(RECORD + TAG)
                    .map(|record| {
                        let opened = key.open_in_place(nonce(&mut seq), Aad::empty(), record);
                        IoSlice::new(opened.expect("a record opens"))
                    })
                    .collect();
                let written = rustix::io::pwritev(&file, &bodies, at as u64).unwrap();
                assert_eq!(written, CHUNK, "a short write of the copy");
            }
            tcp.write_all(&[1]).unwrap();
        }
    }
}
