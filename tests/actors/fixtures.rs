//! The actors and messages the tests use.

use std::time::Duration;

use actix::prelude::*;
use nimbus::actor::{self, ActorHandle, Registry, RemoteActor, RemoteMessage};
use nimbus::cluster::{
    ActorId, BinaryRequest, ControlRequest, DeathCause, DirectoryReply, DirectoryRequest,
    MembershipReply, MembershipRequest, ObjectId, ObjectLocation, ObjectRequest, RefChange,
    RefHolder, RefUpdate, ResourceSet, StateRequest, StateScope, Subsystem, WorkerRequest,
};
use nimbus::object_store::{self, ObjectRef, RawBytes};
use nimbus::wire::{Incarnation, NodeIdentity};
use serde::{Deserialize, Serialize};

/// A task that halves an even number and fails on an odd one (registered
/// by `remote_task!`, with no `Registry` entry).
pub const HALVE: nimbus::task::TaskFn<u64, u64> = nimbus::task::TaskFn::new("tests.halve");
nimbus::remote_task!(HALVE, |n: u64| match n % 2 {
    0 => Ok(n / 2),
    _ => Err(format!("{n} is odd")),
});

pub fn registry() -> Registry {
    crate::tune::register(Registry::new())
        .actor::<Counter>()
        .message::<Counter, Add>()
        .message::<Counter, SlowAdd>()
        .message::<Counter, HoldUntil>()
        .message::<Counter, Boom>()
        .message::<Counter, StartChild>()
        .message::<Counter, crate::owners::SpawnCounter>()
        .message::<Counter, EnvVar>()
        .message::<Counter, BoomOfSize>()
        .message::<Counter, Impersonate>()
        .message::<Counter, Trespass>()
        .message::<Counter, Print>()
        .message::<Counter, KeepRecord>()
        .message::<Counter, Chatter>()
        .message::<Counter, Trace>()
        .actor::<Sequencer>()
        .message::<Sequencer, Push>()
        .message::<Sequencer, Seen>()
        .actor::<Reader>()
        .message::<Reader, SumObject>()
        .message::<Reader, DigestBytes>()
        .message::<Reader, PutBytes>()
        .message::<Reader, PutNumbers>()
        .actor::<Relay>()
        .message::<Relay, Forward>()
        .message::<Relay, AddToNamed>()
        .actor::<Partner>()
        .message::<Partner, Meet>()
        .message::<Partner, AddToPeer>()
}

/// A counter that can be slow, or panic.
pub struct Counter(pub i64);

impl Actor for Counter {
    type Context = Context<Self>;
}

impl RemoteActor for Counter {
    const NAME: &'static str = "tests.Counter";
    type Args = i64;
    fn from_args(start: i64) -> Self {
        Counter(start)
    }
}

#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "i64")]
pub struct Add(pub i64);

impl RemoteMessage for Add {
    const NAME: &'static str = "tests.Add";
}

impl Handler<Add> for Counter {
    type Result = i64;
    fn handle(&mut self, Add(n): Add, _: &mut Context<Self>) -> i64 {
        self.0 += n;
        self.0
    }
}

/// From inside a worker, tries to speak for the head (leave and heartbeat
/// as it) and for another actor (report it dead); the outcome of each.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Vec<String>")]
pub struct Impersonate {
    /// The other actor.
    pub victim: ActorId,
}

impl RemoteMessage for Impersonate {
    const NAME: &'static str = "tests.Impersonate";
}

impl Handler<Impersonate> for Counter {
    type Result = ResponseFuture<Vec<String>>;
    fn handle(
        &mut self,
        Impersonate { victim }: Impersonate,
        _: &mut Context<Self>,
    ) -> Self::Result {
        Box::pin(async move {
            let Some(context) = actor::ProcessContext::current() else {
                return vec!["not a worker".into()];
            };
            let ask = |request: ControlRequest| async move {
                match context.call_head(request).await {
                    Ok(reply) => format!("accepted: {reply:?}"),
                    Err(e) => e.to_string(),
                }
            };
            let status = context.call_head(MembershipRequest::Status).await;
            let Ok(MembershipReply::Status(status)) = status else {
                return vec![format!("no status: {status:?}")];
            };
            let Some(head) = status.nodes.into_iter().find(|n| n.head) else {
                return vec!["no head listed".into()];
            };
            let head = NodeIdentity {
                name: head.id,
                incarnation: Incarnation(head.incarnation),
            };
            let located = context
                .call_head(DirectoryRequest::LocateActor(victim))
                .await;
            let Ok(DirectoryReply::Actor(Some(record))) = located else {
                return vec![format!("victim not found: {located:?}")];
            };
            let leave = MembershipRequest::Leave { node: head.clone() };
            let beat = MembershipRequest::Heartbeat {
                node: head,
                used: ResourceSet::default(),
                host: None,
                renew: None,
            };
            let down = DirectoryRequest::ActorDown {
                actor: victim,
                incarnation: record.incarnation,
                reason: DeathCause::Stopped,
                restarting: false,
            };
            vec![
                ask(leave.into()).await,
                ask(beat.into()).await,
                ask(down.into()).await,
            ]
        })
    }
}

/// From inside a worker, tries what a worker may not do to another job
/// (write its library records, kill its actor, read its actor's log and
/// its output, spawn for it),
/// what no worker may do (read its node's log, upload a program it does not
/// run, list the node's objects, drop a copy), and one thing it may (kill
/// `sibling`, of its own job); then reads and changes the other job's
/// `objects`; then finds the victim by id and by name and calls it (each
/// refused), and finds and calls the shared actor (its count); then looks
/// for `token` in the environment and arguments of
/// `pids` and in every file under `home`, and signals `pids` (signal 0).
/// The outcome of each, in that order, then `token found in ...`,
/// `read ...` and `signalled ...` lines.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Vec<String>")]
pub struct Trespass {
    /// An actor of another job, not shared.
    pub victim: ActorHandle<Counter>,
    /// Its name.
    pub victim_name: String,
    /// Its node.
    pub victim_node: String,
    /// Its worker's address and incarnation, to call it without the
    /// directory.
    pub victim_at: (std::net::SocketAddr, Incarnation),
    /// The name of a shared actor of that job (`SpawnOptions::shared`).
    pub shared: String,
    /// Its job.
    pub victim_job: String,
    /// An actor of this worker's job, on the victim's node.
    pub sibling: ActorId,
    /// The actor this message is sent to (whose references it may change).
    pub me: ActorId,
    /// The cluster's token, to look for.
    pub token: String,
    /// The cluster's processes (nodes and workers) and its driver.
    pub pids: Vec<u32>,
    /// The cluster's state directory (`NIMBUS_HOME`).
    pub home: std::path::PathBuf,
    /// Objects of the other job: a small one, a large one, and one held
    /// before it exists.
    pub objects: Vec<ObjectId>,
    /// The node holding them.
    pub objects_at: String,
}

impl RemoteMessage for Trespass {
    const NAME: &'static str = "tests.Trespass";
}

impl Handler<Trespass> for Counter {
    type Result = ResponseFuture<Vec<String>>;
    fn handle(&mut self, trespass: Trespass, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let Some(context) = actor::ProcessContext::current() else {
                return vec!["not a worker".into()];
            };
            let victim = trespass.victim.id();
            let status = context.call_head(MembershipRequest::Status).await;
            let Ok(MembershipReply::Status(status)) = status else {
                return vec![format!("no status: {status:?}")];
            };
            let connection = match reach(context, &status, &trespass.victim_node).await {
                Ok(connection) => connection,
                Err(e) => return vec![format!("the victim's node: {e}")],
            };
            let spec = nimbus::cluster::ActorSpec {
                actor: ActorId::random(),
                type_name: "tests.Counter".into(),
                name: None,
                args: Vec::new(),
                resources: ResourceSet::default(),
                max_restarts: 0,
                restarts: 0,
                node: None,
                job: trespass.victim_job.clone(),
                detached: false,
                shared: false,
                binary: context.binary.1.clone(),
                bundle: None,
                owner: None,
            };
            let requests = [
                WorkerRequest::KillActor(victim),
                WorkerRequest::ReadLog {
                    actor: victim,
                    stderr: true,
                    offset: 0,
                    max: 1024,
                },
                WorkerRequest::ReadOutput {
                    job: trespass.victim_job.clone(),
                    after: 0,
                    max: 10,
                },
                WorkerRequest::StartActor(spec),
                WorkerRequest::ReadNodeLog {
                    offset: 0,
                    max: 1024,
                },
            ];
            // The other job's library records, at the head.
            let plant = StateRequest::Put {
                scope: StateScope {
                    library: "tests".into(),
                    job: trespass.victim_job.clone(),
                },
                key: "planted".into(),
                value: vec![1],
            };
            let mut outcomes = vec![match context.call_head(plant).await {
                Ok(reply) => format!("accepted: {reply:?}"),
                Err(e) => e.to_string(),
            }];
            for request in requests.into_iter().map(ControlRequest::Workers).chain([
                ControlRequest::from(BinaryRequest::UploadBinary {
                    hash: "00".repeat(32),
                    offset: 0,
                    total: 1,
                    chunk: vec![0],
                }),
                ObjectRequest::ListObjects.into(),
                ObjectRequest::FreeObject(trespass.objects[1]).into(),
                WorkerRequest::KillActor(trespass.sibling).into(),
            ]) {
                outcomes.push(outcome(&connection, request).await);
            }
            let Some(owner) = status.nodes.iter().find(|n| n.id == trespass.objects_at) else {
                return vec![format!(
                    "the objects' node {} is not listed",
                    trespass.objects_at
                )];
            };
            let (small, large, pending) = (
                trespass.objects[0],
                trespass.objects[1],
                trespass.objects[2],
            );
            let read = |id| ObjectRequest::ReadObject {
                id,
                offset: 0,
                len: 16,
                copy_at: None,
            };
            let me = RefHolder::Process {
                id: 1,
                label: "the trespasser".into(),
                worker: Some((
                    trespass.me,
                    context.endpoint.identity().identity.incarnation,
                )),
                job: None,
            };
            let at_owner = [
                read(small),
                read(large),
                ObjectRequest::OpenObject(large),
                ObjectRequest::AwaitObject {
                    id: large,
                    wait_ms: 1000,
                },
                ObjectRequest::UpdateRefs {
                    holder: me.clone(),
                    updates: vec![RefUpdate {
                        id: small,
                        change: RefChange::Hold { arrived: false },
                    }],
                },
                ObjectRequest::FailObject {
                    id: small,
                    holder: me.clone(),
                    message: "failed by another job".into(),
                },
                ObjectRequest::SealObject {
                    id: large,
                    written: false,
                },
                ObjectRequest::PutObjectChunk {
                    id: large,
                    offset: 1,
                    total: 1 << 20,
                    holder: me.clone(),
                    contains: Vec::new(),
                    chunk: vec![0],
                },
                ObjectRequest::UpdateRefs {
                    holder: me.clone(),
                    updates: vec![RefUpdate {
                        id: pending,
                        change: RefChange::Hold { arrived: false },
                    }],
                },
                ObjectRequest::FailObject {
                    id: pending,
                    holder: me,
                    message: "failed by another job before it exists".into(),
                },
            ];
            let pull = ObjectRequest::PullObject {
                id: large,
                owner: ObjectLocation {
                    node: owner.identity(),
                    address: owner.address,
                },
                wait_ms: 1000,
            };
            let owner_connection = match reach(context, &status, &owner.id).await {
                Ok(owner_connection) => owner_connection,
                Err(e) => return vec![format!("the objects' node: {e}")],
            };
            let asked = at_owner
                .iter()
                .map(|request| (&owner_connection, request))
                .chain([(&connection, &pull)]);
            for (to, request) in asked {
                outcomes.push(outcome(to, request.clone()).await);
            }
            let found = [
                DirectoryRequest::LocateActor(victim),
                DirectoryRequest::LookupName(trespass.victim_name),
            ];
            for request in found {
                outcomes.push(match context.call_head(request).await {
                    Ok(reply) => format!("found: {reply:?}"),
                    Err(e) => e.to_string(),
                });
            }
            outcomes.push(match trespass.victim.send(Add(0)).await {
                Ok(count) => format!("called the victim: {count}"),
                Err(e) => e.to_string(),
            });
            outcomes.push(call_directly(context, victim, trespass.victim_at).await);
            outcomes.push(match actor::get_actor::<Counter>(&trespass.shared).await {
                Ok(Some(shared)) => match shared.send(Add(0)).await {
                    Ok(count) => format!("shared: {count}"),
                    Err(e) => format!("shared, but the call failed: {e}"),
                },
                other => format!("shared not found: {other:?}"),
            });
            let me = std::process::id();
            for pid in trespass.pids.into_iter().filter(|pid| *pid != me) {
                for what in ["environ", "cmdline"] {
                    let bytes = std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default();
                    if String::from_utf8_lossy(&bytes).contains(&trespass.token) {
                        outcomes.push(format!("token found in /proc/{pid}/{what}"));
                    }
                }
                if std::fs::read(format!("/proc/{pid}/environ")).is_ok() {
                    outcomes.push(format!("read /proc/{pid}/environ"));
                }
                // SAFETY: signal 0 only checks that the signal may be sent.
                if unsafe { libc::kill(pid as libc::pid_t, 0) } == 0 {
                    outcomes.push(format!("signalled {pid}"));
                }
            }
            // The other job's large object, by its file in shared memory,
            // and the segment its processes share.
            let large = trespass.objects[1].to_string();
            let mut dirs = vec![std::path::PathBuf::from("/dev/shm")];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        dirs.push(path);
                    } else if [large.as_str(), crate::tests::SEGMENT]
                        .map(Some)
                        .contains(&entry.file_name().to_str())
                        && std::fs::File::open(&path).is_ok()
                    {
                        outcomes.push(format!("opened {}", path.display()));
                    }
                }
            }
            let mut dirs = vec![trespass.home];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let path = entry.path();
                    if path.is_dir() {
                        dirs.push(path);
                    } else if let Ok(bytes) = std::fs::read(&path) {
                        let text = String::from_utf8_lossy(&bytes);
                        if text.contains(&trespass.token) {
                            outcomes.push(format!("token found in {}", path.display()));
                        }
                    }
                }
            }
            outcomes
        })
    }
}

/// Calls `Add(0)` on `actor` at its worker's address, without asking the
/// directory where it is: the reply, or why there is none.
async fn call_directly(
    context: &actor::ProcessContext,
    actor: ActorId,
    (address, incarnation): (std::net::SocketAddr, Incarnation),
) -> String {
    let worker = NodeIdentity {
        name: actor.worker_name(),
        incarnation,
    };
    let call = actor::ActorCall {
        actor,
        message: "tests.Add".into(),
        payload: rmp_serde::to_vec_named(&Add(0)).unwrap(),
    };
    let body = rmp_serde::to_vec_named(&call).unwrap();
    let options = nimbus::transport::RequestOptions::control();
    let called = async {
        let connection = context.endpoint.connect(address, Some(&worker)).await?;
        let channel = connection.open_channel().await?;
        anyhow::Ok(channel.request(body, options).await?)
    };
    match called.await {
        Ok(reply) => format!("called the victim at its address: {reply:?}"),
        Err(e) => format!("{e:#}"),
    }
}

/// A connection to the node of `status` named `name`.
async fn reach(
    context: &actor::ProcessContext,
    status: &nimbus::cluster::ClusterStatus,
    name: &str,
) -> Result<nimbus::transport::Connection, String> {
    let node = status
        .nodes
        .iter()
        .find(|n| n.id == name)
        .ok_or_else(|| format!("{name} is not listed"))?;
    let connected = context
        .endpoint
        .connect(node.address, Some(&node.identity()))
        .await;
    connected.map_err(|e| format!("cannot reach {name}: {e}"))
}

/// What `request` to `to` got: `accepted: REPLY`, or the error.
async fn outcome(to: &nimbus::transport::Connection, request: impl Subsystem) -> String {
    let options = nimbus::transport::RequestOptions::control();
    match nimbus::client::call(to, request, options).await {
        Ok(reply) => format!("accepted: {reply:?}"),
        Err(e) => e.to_string(),
    }
}

/// Prints a line to the worker's stdout (which goes to its log).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Print(pub String);

impl RemoteMessage for Print {
    const NAME: &'static str = "tests.Print";
}

impl Handler<Print> for Counter {
    type Result = ();
    fn handle(&mut self, Print(line): Print, _: &mut Context<Self>) {
        println!("{line}");
    }
}

/// Sets one of the `tests` library's records of the worker's job
/// (`nimbus::library::Records`).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub struct KeepRecord(pub String, pub Vec<u8>);

impl RemoteMessage for KeepRecord {
    const NAME: &'static str = "tests.KeepRecord";
}

impl Handler<KeepRecord> for Counter {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(
        &mut self,
        KeepRecord(key, value): KeepRecord,
        _: &mut Context<Self>,
    ) -> Self::Result {
        Box::pin(async move {
            let records =
                nimbus::library::Records::of_this_job("tests").map_err(|e| e.to_string())?;
            records.put(&key, &value).await.map_err(|e| e.to_string())
        })
    }
}

/// Logs a `tracing` event at info level (the worker's log gets it, with
/// the worker's job, actor and node).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Trace(pub String);

impl RemoteMessage for Trace {
    const NAME: &'static str = "tests.Trace";
}

impl Handler<Trace> for Counter {
    type Result = ();
    fn handle(&mut self, Trace(line): Trace, _: &mut Context<Self>) {
        tracing::info!("{line}");
    }
}

/// Writes this many bytes to the worker's stderr (which goes to its log
/// directly), in lines of 256 KiB (its driver is shown 4 KiB of each).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Chatter(pub usize);

impl RemoteMessage for Chatter {
    const NAME: &'static str = "tests.Chatter";
}

impl Handler<Chatter> for Counter {
    type Result = ();
    fn handle(&mut self, Chatter(bytes): Chatter, _: &mut Context<Self>) {
        use std::io::Write;
        const LINE: usize = 256 << 10;
        let line = format!("{}\n", "x".repeat(LINE - 1));
        let mut err = std::io::stderr().lock();
        for _ in 0..bytes.div_ceil(LINE) {
            err.write_all(line.as_bytes()).unwrap();
        }
    }
}

/// The worker's value of an environment variable.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Option<String>")]
pub struct EnvVar(pub String);

impl RemoteMessage for EnvVar {
    const NAME: &'static str = "tests.EnvVar";
}

impl Handler<EnvVar> for Counter {
    type Result = Option<String>;
    fn handle(&mut self, EnvVar(name): EnvVar, _: &mut Context<Self>) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// Adds after a pause: a call that stays in flight.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "i64")]
pub struct SlowAdd(pub i64, pub u64);

impl RemoteMessage for SlowAdd {
    const NAME: &'static str = "tests.SlowAdd";
}

impl Handler<SlowAdd> for Counter {
    type Result = ResponseActFuture<Self, i64>;
    fn handle(&mut self, SlowAdd(n, ms): SlowAdd, _: &mut Context<Self>) -> Self::Result {
        Box::pin(
            actix::clock::sleep(Duration::from_millis(ms))
                .into_actor(self)
                .map(move |_, counter, _| {
                    counter.0 += n;
                    counter.0
                }),
        )
    }
}

/// Holds the actor's thread until a file appears at the path (a long
/// synchronous handler, such as a training step), at most
/// [`HOLD_AT_MOST`]; answers whether it appeared.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "bool")]
pub struct HoldUntil(pub String);

impl RemoteMessage for HoldUntil {
    const NAME: &'static str = "tests.HoldUntil";
}

/// The longest [`HoldUntil`] holds the actor's thread.
pub const HOLD_AT_MOST: Duration = Duration::from_secs(30);

impl Handler<HoldUntil> for Counter {
    type Result = bool;
    fn handle(&mut self, HoldUntil(path): HoldUntil, _: &mut Context<Self>) -> bool {
        let started = std::time::Instant::now();
        while started.elapsed() < HOLD_AT_MOST {
            if std::path::Path::new(&path).exists() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}

/// Panics in the handler.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Boom(pub String);

impl RemoteMessage for Boom {
    const NAME: &'static str = "tests.Boom";
}

impl Handler<Boom> for Counter {
    type Result = ();
    fn handle(&mut self, Boom(message): Boom, _: &mut Context<Self>) {
        panic!("{message}");
    }
}

/// Panics with a message of this many bytes (as an `assert_eq!` on big
/// vectors does).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct BoomOfSize(pub usize);

impl RemoteMessage for BoomOfSize {
    const NAME: &'static str = "tests.BoomOfSize";
}

impl Handler<BoomOfSize> for Counter {
    type Result = ();
    fn handle(&mut self, BoomOfSize(size): BoomOfSize, _: &mut Context<Self>) {
        panic!("{}", "x".repeat(size));
    }
}

/// Starts a child process that inherits the worker's stdout and outlives
/// it (a `sleep`), as actors that run tools do; replies with its pid.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "u32")]
pub struct StartChild;

impl RemoteMessage for StartChild {
    const NAME: &'static str = "tests.StartChild";
}

impl Handler<StartChild> for Counter {
    type Result = u32;
    fn handle(&mut self, _: StartChild, _: &mut Context<Self>) -> u32 {
        std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep starts")
            .id()
    }
}

/// A message this binary handles but never registers: to the workers it is
/// a message type they do not know.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "i64")]
pub struct Stray;

impl RemoteMessage for Stray {
    const NAME: &'static str = "tests.Stray";
}

impl Handler<Stray> for Counter {
    type Result = i64;
    fn handle(&mut self, _: Stray, _: &mut Context<Self>) -> i64 {
        self.0
    }
}

/// Records the order in which numbers arrive.
#[derive(Default)]
pub struct Sequencer {
    next: u64,
    out_of_order: u64,
}

impl Actor for Sequencer {
    type Context = Context<Self>;
}

impl RemoteActor for Sequencer {
    const NAME: &'static str = "tests.Sequencer";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Sequencer::default()
    }
}

#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Push(pub u64);

impl RemoteMessage for Push {
    const NAME: &'static str = "tests.Push";
}

impl Handler<Push> for Sequencer {
    type Result = ();
    fn handle(&mut self, Push(n): Push, _: &mut Context<Self>) {
        if n != self.next {
            self.out_of_order += 1;
        }
        self.next = n + 1;
    }
}

/// (numbers seen, numbers out of order)
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "(u64, u64)")]
pub struct Seen;

impl RemoteMessage for Seen {
    const NAME: &'static str = "tests.Seen";
}

impl Handler<Seen> for Sequencer {
    type Result = MessageResult<Seen>;
    fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
        MessageResult((self.next, self.out_of_order))
    }
}

/// Calls other actors on behalf of the test.
pub struct Relay;

impl Actor for Relay {
    type Context = Context<Self>;
}

impl RemoteActor for Relay {
    const NAME: &'static str = "tests.Relay";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Relay
    }
}

/// Adds `n` to the counter behind the handle carried in the message.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<i64, String>")]
pub struct Forward {
    pub counter: ActorHandle<Counter>,
    pub n: i64,
}

impl RemoteMessage for Forward {
    const NAME: &'static str = "tests.Forward";
}

impl Handler<Forward> for Relay {
    type Result = ResponseFuture<Result<i64, String>>;
    fn handle(&mut self, msg: Forward, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            msg.counter
                .send(Add(msg.n))
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Looks a counter up by name and adds `n` to it.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<i64, String>")]
pub struct AddToNamed {
    pub name: String,
    pub n: i64,
}

impl RemoteMessage for AddToNamed {
    const NAME: &'static str = "tests.AddToNamed";
}

impl Handler<AddToNamed> for Relay {
    type Result = ResponseFuture<Result<i64, String>>;
    fn handle(&mut self, msg: AddToNamed, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let counter = actor::get_actor::<Counter>(&msg.name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("no actor named {}", msg.name))?;
            counter.send(Add(msg.n)).await.map_err(|e| e.to_string())
        })
    }
}

/// An actor that keeps a handle to a counter it was introduced to: its
/// calls to it go straight to the counter's worker, head or no head.
#[derive(Default)]
pub struct Partner {
    peer: Option<ActorHandle<Counter>>,
}

impl Actor for Partner {
    type Context = Context<Self>;
}

impl RemoteActor for Partner {
    const NAME: &'static str = "tests.Partner";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Partner::default()
    }
}

/// Keep this counter and read it (adding 0): the handle finds its worker.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<i64, String>")]
pub struct Meet(pub ActorHandle<Counter>);

impl RemoteMessage for Meet {
    const NAME: &'static str = "tests.Meet";
}

impl Handler<Meet> for Partner {
    type Result = ResponseFuture<Result<i64, String>>;
    fn handle(&mut self, Meet(peer): Meet, _: &mut Context<Self>) -> Self::Result {
        self.peer = Some(peer.clone());
        Box::pin(async move { peer.send(Add(0)).await.map_err(|e| e.to_string()) })
    }
}

/// Add `n` to the counter met before.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<i64, String>")]
pub struct AddToPeer(pub i64);

impl RemoteMessage for AddToPeer {
    const NAME: &'static str = "tests.AddToPeer";
}

impl Handler<AddToPeer> for Partner {
    type Result = ResponseFuture<Result<i64, String>>;
    fn handle(&mut self, AddToPeer(n): AddToPeer, _: &mut Context<Self>) -> Self::Result {
        let peer = self.peer.clone();
        Box::pin(async move {
            let peer = peer.ok_or("no peer met yet")?;
            peer.send(Add(n)).await.map_err(|e| e.to_string())
        })
    }
}

/// A local actor that forwards the deaths it is told of.
pub struct Watcher(pub tokio::sync::mpsc::UnboundedSender<actor::ActorDied>);

impl Actor for Watcher {
    type Context = Context<Self>;
}

impl Handler<actor::ActorDied> for Watcher {
    type Result = ();
    fn handle(&mut self, death: actor::ActorDied, _: &mut Context<Self>) {
        let _ = self.0.send(death);
    }
}

/// Reads objects from the object store of its own node.
pub struct Reader;

impl Actor for Reader {
    type Context = Context<Self>;
}

impl RemoteActor for Reader {
    const NAME: &'static str = "tests.Reader";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Reader
    }
}

/// The sum of a list of numbers in the object store.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<u64, String>")]
pub struct SumObject(pub ObjectRef<Vec<u64>>);

impl RemoteMessage for SumObject {
    const NAME: &'static str = "tests.SumObject";
}

impl Handler<SumObject> for Reader {
    type Result = ResponseFuture<Result<u64, String>>;
    fn handle(&mut self, SumObject(object): SumObject, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let numbers = object_store::get(&object)
                .await
                .map_err(|e| e.to_string())?;
            Ok(numbers.iter().sum())
        })
    }
}

/// The length and digest of raw bytes in the object store.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(u64, u64), String>")]
pub struct DigestBytes(pub ObjectRef<RawBytes>);

impl RemoteMessage for DigestBytes {
    const NAME: &'static str = "tests.DigestBytes";
}

impl Handler<DigestBytes> for Reader {
    type Result = ResponseFuture<Result<(u64, u64), String>>;
    fn handle(&mut self, DigestBytes(object): DigestBytes, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let bytes = object_store::get_bytes(&object)
                .await
                .map_err(|e| e.to_string())?;
            Ok((bytes.len() as u64, digest(&bytes)))
        })
    }
}

/// Puts `n` bytes into its own node's store.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<(), String>")]
pub struct PutBytes(pub usize);

impl RemoteMessage for PutBytes {
    const NAME: &'static str = "tests.PutBytes";
}

impl Handler<PutBytes> for Reader {
    type Result = ResponseFuture<Result<(), String>>;
    fn handle(&mut self, PutBytes(n): PutBytes, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            object_store::put_bytes(&vec![7u8; n])
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }
}

/// Puts a list of numbers into its own node's store and hands back the
/// reference (for a reader on another node).
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<ObjectRef<Vec<u64>>, String>")]
pub struct PutNumbers(pub Vec<u64>);

impl RemoteMessage for PutNumbers {
    const NAME: &'static str = "tests.PutNumbers";
}

impl Handler<PutNumbers> for Reader {
    type Result = ResponseFuture<Result<ObjectRef<Vec<u64>>, String>>;
    fn handle(&mut self, PutNumbers(numbers): PutNumbers, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move { object_store::put(&numbers).await.map_err(|e| e.to_string()) })
    }
}

/// FNV-1a over the bytes: equal digests mean (almost surely) equal bytes.
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}
