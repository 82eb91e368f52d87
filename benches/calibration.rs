//! The floors under nimbus's figures on the machine at hand, measured in
//! one run beside nimbus's own paths, so that every optimisation can be
//! judged against what the hardware and the kernel allow:
//!
//! - `floor_{uds,tcp}_{64B,1MiB}_rtt_p50`: a synchronous round trip of a
//!   length-prefixed frame to an echo in another process (this binary,
//!   re-run as `--echo-server`), over a Unix-domain socket and over TCP
//!   on loopback (`TCP_NODELAY`), blocking reads and writes, no framework;
//! - `nimbus_echo_{64B,1MiB}_rtt_p50`: the same payloads as a nimbus
//!   control request (`Echo`) to a node process over QUIC, and
//!   `nimbus_echo_uds_*` over the node's same-host Unix-domain socket
//!   (`transport/local.rs`);
//! - `nimbus_channel_{quic,uds}_echo_{64B,1MiB}_rtt_p50`: the same on an
//!   ordered channel (what an actor call rides), over a QUIC stream and
//!   over the same-host socket;
//! - `nimbus_{quic,uds}_{put_64B,read_64B,release,status}_p50`: real
//!   control requests with their handlers, as a process of the node's host
//!   sends them, over QUIC and over the same-host socket: a 64 B object
//!   put whole (`PutObjectChunk`), read back (`ReadObject`) and released
//!   (`UpdateRefs`, which frees it) on node-1, and `Status` to the head;
//! - `actor_call_{64B}_rtt_p50`: a synchronous actor call from this
//!   process to an actor in a worker process (over the same-host socket);
//! - `actor_call_{syscalls,context_switches}_per_call_{driver,worker}`:
//!   what each synchronous 64 B actor call costs each side in system calls
//!   and context switches (wake-ups), counted by `perf stat` on the whole
//!   process (every thread) during the calls, less what the same process
//!   does in as long a time while idle (timers, heartbeats);
//! - `quic_bulk_*`: quinn's own statistics of the connection to the node
//!   while 64 echoes of 1 MiB are in flight at a time: throughput, packets
//!   lost, congestion events, the congestion window and path MTU at the
//!   end, the path-MTU probes sent and lost and the black holes detected
//!   (each drops the MTU to 1,200 bytes) over the connection's life,
//!   UDP datagrams sent per MiB;
//! - `floor_memcpy_gb_per_s`: one thread copying 256 MiB.
//!
//! ```text
//! cargo bench --bench calibration
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it makes a
//! hundredth of the round trips: a smoke test. Without `perf` (or where
//! the kernel refuses it) the syscall and wake-up counts are left out and
//! the bench says so.

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actix::prelude::*;
use anyhow::{Context as _, Result};
use hdrhistogram::Histogram;
use nimbus::actor::{self, RemoteActor, RemoteMessage, SpawnOptions, Strategy};
use nimbus::client::ClusterClient;
use nimbus::cluster::{
    ControlReply, ControlRequest, MembershipReply, MembershipRequest, ObjectId, ObjectReply,
    ObjectRequest, RefChange, RefHolder, RefUpdate,
};
use nimbus::transport::{Channel, Connection, RequestOptions, TransportConfig};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// Payloads measured: (bytes, label, synchronous round trips).
const PAYLOADS: [(usize, &str, usize); 2] = [(64, "64B", 20_000), (1 << 20, "1MiB", 500)];
/// Actor calls counted by `perf`, made for at least [`MIN_COUNTED`]:
/// perf counts nothing in a window much shorter than that.
const COUNTED_CALLS: usize = 5_000;
const MIN_COUNTED: Duration = Duration::from_millis(500);
/// 1 MiB echoes in the bulk measurement, and how many in flight.
const BULK: (usize, usize) = (2_000, 64);
/// Bytes copied by the memcpy floor.
const MEMCPY_BYTES: usize = 256 << 20;
/// The longest the echo server may take to be ready.
const SERVER_DEADLINE: Duration = Duration::from_secs(10);

/// Echoes payloads (as the microbench's).
struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

impl RemoteActor for Echo {
    const NAME: &'static str = "calibration.Echo";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Echo
    }
}

#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "ByteBuf")]
struct Ping(#[serde(with = "serde_bytes")] Vec<u8>);

impl RemoteMessage for Ping {
    const NAME: &'static str = "calibration.Ping";
}

impl Handler<Ping> for Echo {
    type Result = MessageResult<Ping>;
    fn handle(&mut self, Ping(payload): Ping, _: &mut Context<Self>) -> Self::Result {
        MessageResult(ByteBuf::from(payload))
    }
}

fn registry() -> actor::Registry {
    actor::Registry::new()
        .actor::<Echo>()
        .message::<Echo, Ping>()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--echo-server") {
        return echo_server(&args[at + 1], &args[at + 2]);
    }
    // First: in a worker process (this binary, started by a node) it
    // runs the worker and never returns.
    let mut driver = nimbus::init_with(registry(), nimbus::InitOptions::private(2))?;
    let scale = if args.iter().any(|a| a == "--bench") {
        1
    } else {
        100
    };
    let mut summary = Vec::new();
    for kind in ["uds", "tcp"] {
        for (payload, label, trips) in PAYLOADS {
            let p50 = socket_floor(kind, payload, (trips / scale).max(10))?;
            println!("floor_{kind}_{label}_rtt_p50: {p50:.1} us");
            summary.push(format!("floor_{kind}_{label}_rtt_p50_us={p50:.1}"));
        }
    }
    let gb_per_s = memcpy_floor();
    println!("floor_memcpy_gb_per_s: {gb_per_s:.2} GB/s");

    actix::System::new().block_on(async {
        driver.connect().await?;
        let client = driver
            .local_cluster()
            .context("a private cluster")?
            .client()
            .await?;
        let node = client
            .status()
            .await?
            .node("node-1")
            .cloned()
            .context("node-1 joined")?;
        let cluster = driver.local_cluster().context("a private cluster")?;
        for (kind, same_host_channels) in [("quic", false), ("uds", true)] {
            let config = TransportConfig {
                same_host_channels,
                ..TransportConfig::default()
            };
            let client = ClusterClient::connect_with(
                &cluster.address().to_string(),
                cluster.token(),
                config,
            )
            .await?;
            let connection = client.connect_node(&node).await?;
            anyhow::ensure!(
                connection.local_socket().is_some() == same_host_channels,
                "the {kind} connection does not run over {kind}"
            );
            // QUIC's rows keep their names from before same-host sockets.
            let prefix = if same_host_channels { "uds_" } else { "" };
            let channel = connection.open_channel().await?;
            for (payload, label, trips) in PAYLOADS {
                let trips = (trips / scale).max(10);
                let p50 = p50_us(trips, || echo(&connection, payload)).await?;
                println!("nimbus_echo_{prefix}{label}_rtt_p50: {p50:.1} us");
                summary.push(format!("nimbus_echo_{prefix}{label}_rtt_p50_us={p50:.1}"));
                let p50 = p50_us(trips, || channel_echo(&channel, payload)).await?;
                println!("nimbus_channel_{kind}_echo_{label}_rtt_p50: {p50:.1} us");
                summary.push(format!(
                    "nimbus_channel_{kind}_echo_{label}_rtt_p50_us={p50:.1}"
                ));
            }
            let trips = (PAYLOADS[0].2 / scale).max(10);
            for (request, p50) in object_requests(&connection, trips).await? {
                println!("nimbus_{kind}_{request}_p50: {p50:.1} us");
                summary.push(format!("nimbus_{kind}_{request}_p50_us={p50:.1}"));
            }
            let head = client.head().await?;
            anyhow::ensure!(
                head.local_socket().is_some() == same_host_channels,
                "the {kind} connection to the head does not run over {kind}"
            );
            let p50 = p50_us(trips, || status(&head)).await?;
            println!("nimbus_{kind}_status_p50: {p50:.1} us");
            summary.push(format!("nimbus_{kind}_status_p50_us={p50:.1}"));
            if !same_host_channels {
                quic_bulk(&connection, scale).await?;
            }
        }

        let echo_actor = actor::spawn::<Echo>(
            (),
            SpawnOptions::default()
                .num_cpus(0.1)
                .strategy(Strategy::Node("node-1".into())),
        )
        .await?;
        let call = || async {
            let reply = echo_actor.send(Ping(vec![7; 64])).await?;
            anyhow::ensure!(reply.len() == 64, "the echo changed the payload");
            anyhow::Ok(())
        };
        let trips = (PAYLOADS[0].2 / scale).max(10);
        let mut histogram = Histogram::<u64>::new(3)?;
        for _ in 0..trips {
            let started = Instant::now();
            call().await?;
            histogram.record(started.elapsed().as_nanos() as u64)?;
        }
        let p50 = histogram.value_at_quantile(0.5) as f64 / 1000.0;
        println!("actor_call_64B_rtt_p50: {p50:.1} us");
        summary.push(format!("actor_call_64B_rtt_p50_us={p50:.1}"));

        let worker = client
            .find_actor(&echo_actor.id().to_string())
            .await?
            .context("the echo actor's record")?
            .pid;
        let calls = (COUNTED_CALLS / scale).max(10);
        let sides = [("driver", std::process::id()), ("worker", worker)];
        match Counted::start(&sides) {
            Some(counting) => {
                let started = Instant::now();
                let mut made = 0;
                while made < calls || started.elapsed() < MIN_COUNTED {
                    call().await?;
                    made += 1;
                }
                let busy = counting.stop()?;
                let idle = Counted::start(&sides).context("perf ran a moment ago")?;
                tokio::time::sleep(started.elapsed()).await;
                let idle = idle.stop()?;
                for ((side, _), (busy, idle)) in sides.iter().zip(busy.iter().zip(&idle)) {
                    let per_call = |b: f64, i: f64| (b - i).max(0.0) / made as f64;
                    let syscalls = per_call(busy.0, idle.0);
                    let switches = per_call(busy.1, idle.1);
                    println!("actor_call_syscalls_per_call_{side}: {syscalls:.1} calls");
                    println!(
                        "actor_call_context_switches_per_call_{side}: {switches:.1} switches"
                    );
                    summary.push(format!(
                        "syscalls_per_call_{side}={syscalls:.1} switches_per_call_{side}={switches:.1}"
                    ));
                }
            }
            None => eprintln!(
                "*** perf is missing or refused: syscalls and wake-ups per call NOT measured ***"
            ),
        }
        anyhow::Ok(())
    })?;
    println!("summary: {}", summary.join(" "));
    Ok(())
}

/// One nimbus `Echo` request of `payload` bytes, checked.
async fn echo(connection: &Connection, payload: usize) -> Result<()> {
    let request = ControlRequest::Echo(nimbus::cluster::Echo(vec![1; payload]));
    match nimbus::client::call(connection, request, RequestOptions::bulk()).await? {
        ControlReply::Echo(nimbus::cluster::Echo(back)) if back.len() == payload => Ok(()),
        reply => anyhow::bail!("the echo answered {reply:?}"),
    }
}

/// The requests of a small object's life, as a process of the node's host
/// sends them (`trips` objects, one after the other): put whole
/// (`PutObjectChunk`), read back (`ReadObject`), released (`UpdateRefs`,
/// which frees it). Returns each request's name and median time in
/// microseconds.
async fn object_requests(connection: &Connection, trips: usize) -> Result<Vec<(String, f64)>> {
    let holder = RefHolder::Process {
        id: rand::random(),
        label: format!("calibration pid {}", std::process::id()),
        worker: None,
        job: None,
    };
    let mut times = Vec::new();
    for name in ["put_64B", "read_64B", "release"] {
        times.push((name, Histogram::<u64>::new(3)?));
    }
    for _ in 0..trips {
        let id = ObjectId::random();
        let requests: [ObjectRequest; 3] = [
            ObjectRequest::PutObjectChunk {
                id,
                offset: 0,
                total: 64,
                holder: holder.clone(),
                contains: Vec::new(),
                chunk: vec![3; 64],
            },
            ObjectRequest::ReadObject {
                id,
                offset: 0,
                len: 64,
                copy_at: None,
            },
            ObjectRequest::UpdateRefs {
                holder: holder.clone(),
                updates: vec![RefUpdate {
                    id,
                    change: RefChange::Release,
                }],
            },
        ];
        for (request, (name, histogram)) in requests.into_iter().zip(times.iter_mut()) {
            let started = Instant::now();
            let reply = nimbus::client::call(connection, request, RequestOptions::bulk()).await?;
            let elapsed = started.elapsed();
            match reply {
                ObjectReply::Ack => {}
                ObjectReply::Bytes(bytes) if bytes == [3; 64] => {}
                reply => anyhow::bail!("{name} answered {reply:?}"),
            }
            histogram.record(elapsed.as_nanos() as u64)?;
        }
    }
    Ok(times
        .into_iter()
        .map(|(name, histogram)| {
            let p50 = histogram.value_at_quantile(0.5) as f64 / 1000.0;
            (name.to_string(), p50)
        })
        .collect())
}

/// One `Status` request to the head (`nimbus status`), checked.
async fn status(head: &Connection) -> Result<()> {
    let request = MembershipRequest::Status;
    match nimbus::client::call(head, request, RequestOptions::bulk()).await? {
        MembershipReply::Status(status) if !status.nodes.is_empty() => Ok(()),
        reply => anyhow::bail!("the head answered {reply:?}"),
    }
}

/// The median of `trips` timed round trips of `trip`, in microseconds.
async fn p50_us<F: std::future::Future<Output = Result<()>>>(
    trips: usize,
    mut trip: impl FnMut() -> F,
) -> Result<f64> {
    let mut histogram = Histogram::<u64>::new(3)?;
    for _ in 0..trips {
        let started = Instant::now();
        trip().await?;
        histogram.record(started.elapsed().as_nanos() as u64)?;
    }
    Ok(histogram.value_at_quantile(0.5) as f64 / 1000.0)
}

/// One `Echo` of `payload` bytes on an ordered channel, checked.
async fn channel_echo(channel: &Channel, payload: usize) -> Result<()> {
    let request = rmp_serde::to_vec_named(&ControlRequest::Echo(nimbus::cluster::Echo(vec![
            1;
            payload
        ])))?;
    let reply = channel.request(request, RequestOptions::bulk()).await?;
    match nimbus::wire::decode(&reply)? {
        ControlReply::Echo(nimbus::cluster::Echo(back)) if back.len() == payload => Ok(()),
        reply => anyhow::bail!("the echo answered {reply:?}"),
    }
}

/// 1 MiB echoes, [`BULK`]`.1` in flight, and quinn's statistics of the
/// connection meanwhile.
async fn quic_bulk(connection: &Connection, scale: usize) -> Result<()> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let (echoes, window) = BULK;
    let echoes = (echoes / scale).max(window);
    let before = connection.stats();
    let started = Instant::now();
    let mut in_flight = FuturesUnordered::new();
    let mut issued = 0;
    while issued < echoes || !in_flight.is_empty() {
        while issued < echoes && in_flight.len() < window {
            in_flight.push(echo(connection, 1 << 20));
            issued += 1;
        }
        if let Some(done) = in_flight.next().await {
            done?;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = connection.stats();
    let mib = 2.0 * echoes as f64;
    println!(
        "quic_bulk_gb_per_s: {:.2} GB/s",
        mib * (1 << 20) as f64 / elapsed / 1e9
    );
    println!(
        "quic_bulk_lost_packets: {} packets",
        after.path.lost_packets - before.path.lost_packets
    );
    println!(
        "quic_bulk_congestion_events: {} events",
        after.path.congestion_events - before.path.congestion_events
    );
    println!("quic_bulk_cwnd_end: {} bytes", after.path.cwnd);
    println!("quic_bulk_mtu: {} bytes", after.path.current_mtu);
    println!(
        "quic_bulk_mtu_probes_sent: {} probes",
        after.path.sent_plpmtud_probes
    );
    println!(
        "quic_bulk_mtu_probes_lost: {} probes",
        after.path.lost_plpmtud_probes
    );
    println!(
        "quic_bulk_black_holes_detected: {} times",
        after.path.black_holes_detected
    );
    let datagrams = (after.udp_tx.datagrams - before.udp_tx.datagrams) as f64;
    println!(
        "quic_bulk_udp_datagrams_sent_per_mib: {:.0} datagrams",
        datagrams / (echoes as f64)
    );
    Ok(())
}

/// `perf stat` counting system calls and context switches of processes.
struct Counted {
    perfs: Vec<Child>,
}

impl Counted {
    /// Starts counting for each of `sides`; `None` without a working perf.
    fn start(sides: &[(&str, u32)]) -> Option<Counted> {
        let mut perfs = Vec::new();
        for (_, pid) in sides {
            let child = Command::new("perf")
                .args([
                    "stat",
                    "-x",
                    ",",
                    "-e",
                    "raw_syscalls:sys_enter,context-switches",
                ])
                .args(["-p", &pid.to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .ok()?;
            perfs.push(child);
        }
        // perf attaches asynchronously: a counting perf has opened its
        // counters once its /proc entry lists them as file descriptors.
        let deadline = Instant::now() + SERVER_DEADLINE;
        for perf in &perfs {
            while perf_fds(perf.id()) < 2 {
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::yield_now();
            }
        }
        Some(Counted { perfs })
    }

    /// Stops every perf; (system calls, context switches) of each side.
    fn stop(self) -> Result<Vec<(f64, f64)>> {
        let mut counts = Vec::new();
        for perf in self.perfs {
            // SAFETY: kill has no memory preconditions; perf is our child.
            unsafe { libc::kill(perf.id() as i32, libc::SIGINT) };
            let out = perf.wait_with_output()?;
            let text = String::from_utf8_lossy(&out.stderr);
            // `<not counted>`: no thread of the process ran while perf
            // counted (an idle window), so nothing happened.
            let count = |event: &str| -> Result<f64> {
                text.lines()
                    .find(|l| l.contains(event))
                    .and_then(|l| l.split(',').next())
                    .and_then(|v| match v {
                        "<not counted>" => Some(0.0),
                        v => v.parse().ok(),
                    })
                    .with_context(|| format!("perf counted no {event}: {text}"))
            };
            counts.push((count("raw_syscalls")?, count("context-switches")?));
        }
        Ok(counts)
    }
}

/// How many perf-event file descriptors process `pid` holds.
fn perf_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|entries| {
            entries
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().contains("perf_event"))
                .count()
        })
        .unwrap_or(0)
}

/// The p50 in µs of `trips` synchronous round trips of `payload` bytes to
/// an echo server of `kind` in another process.
fn socket_floor(kind: &str, payload: usize, trips: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let address = match kind {
        "uds" => dir.path().join("echo.sock").to_string_lossy().into_owned(),
        _ => "127.0.0.1:0".to_string(),
    };
    let mut server = Command::new(std::env::current_exe()?)
        .args(["--echo-server", kind, &address])
        .stdout(Stdio::piped())
        .spawn()?;
    // The server prints where it listens once it does.
    let mut ready = String::new();
    let mut stdout = server.stdout.take().context("the server's stdout")?;
    let mut byte = [0u8; 1];
    let deadline = Instant::now() + SERVER_DEADLINE;
    while !ready.ends_with('\n') {
        anyhow::ensure!(Instant::now() < deadline, "the echo server did not start");
        if stdout.read(&mut byte)? == 0 {
            anyhow::bail!("the echo server exited");
        }
        ready.push(byte[0] as char);
    }
    let listening = ready.trim().to_string();
    let mut stream: Box<dyn ReadWrite> = match kind {
        "uds" => Box::new(UnixStream::connect(&listening)?),
        _ => {
            let stream = TcpStream::connect(&listening)?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        }
    };
    let frame = vec![3u8; payload];
    let mut back = vec![0u8; payload];
    let mut histogram = Histogram::<u64>::new(3)?;
    for i in 0..trips + trips / 10 {
        let started = Instant::now();
        stream.write_all(&(payload as u32).to_le_bytes())?;
        stream.write_all(&frame)?;
        let mut len = [0u8; 4];
        stream.read_exact(&mut len)?;
        anyhow::ensure!(u32::from_le_bytes(len) as usize == payload, "bad echo");
        stream.read_exact(&mut back)?;
        // The first tenth warms up.
        if i >= trips / 10 {
            histogram.record(started.elapsed().as_nanos() as u64)?;
        }
    }
    drop(stream);
    server.wait()?;
    Ok(histogram.value_at_quantile(0.5) as f64 / 1000.0)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The echo server: accepts one connection, echoes its frames until it
/// closes.
fn echo_server(kind: &str, address: &str) -> Result<()> {
    let mut stream: Box<dyn ReadWrite> = match kind {
        "uds" => {
            let listener = UnixListener::bind(address)?;
            println!("{address}");
            Box::new(listener.accept()?.0)
        }
        "tcp" => {
            let listener = TcpListener::bind(address)?;
            println!("{}", listener.local_addr()?);
            let (stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            Box::new(stream)
        }
        other => anyhow::bail!("unknown echo server kind {other:?}"),
    };
    let mut buffer = Vec::new();
    loop {
        let mut len = [0u8; 4];
        if stream.read_exact(&mut len).is_err() {
            return Ok(());
        }
        buffer.resize(u32::from_le_bytes(len) as usize, 0);
        stream.read_exact(&mut buffer)?;
        stream.write_all(&len)?;
        stream.write_all(&buffer)?;
    }
}

/// GB/s of one thread copying [`MEMCPY_BYTES`] (pages faulted in first).
fn memcpy_floor() -> f64 {
    let source = vec![5u8; MEMCPY_BYTES];
    let mut target = vec![0u8; MEMCPY_BYTES];
    target.copy_from_slice(&source);
    let started = Instant::now();
    let rounds = 4;
    for _ in 0..rounds {
        target.copy_from_slice(std::hint::black_box(&source));
    }
    std::hint::black_box(&target);
    (rounds * MEMCPY_BYTES) as f64 / started.elapsed().as_secs_f64() / 1e9
}
