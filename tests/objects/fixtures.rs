//! The actors and task functions the object-store and task tests use.

use std::time::Duration;

use actix::prelude::*;
use nimbus::actor::{ProcessContext, Registry, RemoteActor, RemoteMessage};
use nimbus::object_store::{self, ObjectRef, RawBytes};
use nimbus::task::TaskFn;
use serde::{Deserialize, Serialize};

pub const SQUARE: TaskFn<u64, u64> = TaskFn::new("tests.square");
pub const SUM: TaskFn<Vec<u64>, u64> = TaskFn::new("tests.sum");
pub const FAIL: TaskFn<(String, String), u64> = TaskFn::new("tests.fail");
pub const PANIC: TaskFn<(String, String), u64> = TaskFn::new("tests.panic");
/// Sleeps this many milliseconds, then returns the address of the node it
/// ran on.
pub const WHERE: TaskFn<u64, String> = TaskFn::new("tests.where");
/// First attempt: writes its pid to the file and hangs; later attempts
/// return their pid.
pub const PID_THEN_HANG: TaskFn<String, u32> = TaskFn::new("tests.pid_then_hang");
/// Appends `start <index>` to the file, sleeps this many milliseconds,
/// appends `end <index>`, and returns its pid (tasks in flight on one
/// worker).
pub const RECORD: TaskFn<(String, u64, u64), u32> = TaskFn::new("tests.record");
/// Returns the references it is given (references inside a result).
pub const PASS_ON: TaskFn<Vec<ObjectRef<u64>>, Vec<ObjectRef<u64>>> = TaskFn::new("tests.pass_on");

pub fn registry() -> Registry {
    Registry::new()
        .actor::<Keeper>()
        .message::<Keeper, Keep>()
        .message::<Keeper, SumKept>()
        .message::<Keeper, Forget>()
        .message::<Keeper, PutMany>()
        .message::<Keeper, Digests>()
        .task(SQUARE, |x: u64| Ok::<_, String>(x * x))
        .task(SUM, |xs: Vec<u64>| Ok::<_, String>(xs.iter().sum()))
        .task(FAIL, |(why, attempts): (String, String)| {
            count_attempt(&attempts)?;
            Err::<u64, _>(why)
        })
        .task(
            PANIC,
            |(why, attempts): (String, String)| -> Result<u64, String> {
                count_attempt(&attempts)?;
                panic!("{why}")
            },
        )
        .task(WHERE, |ms: u64| {
            std::thread::sleep(Duration::from_millis(ms));
            let context = ProcessContext::current().ok_or("not initialised")?;
            Ok::<_, String>(context.home.to_string())
        })
        .task(PID_THEN_HANG, |path: String| {
            if std::path::Path::new(&path).exists() {
                return Ok(std::process::id());
            }
            let temporary = format!("{path}.tmp");
            std::fs::write(&temporary, std::process::id().to_string())
                .and_then(|()| std::fs::rename(&temporary, &path))
                .map_err(|e| e.to_string())?;
            // Killed by the test long before this ends.
            std::thread::sleep(Duration::from_secs(120));
            Err("not killed".to_string())
        })
        .task(PASS_ON, Ok::<_, String>)
        .task(RECORD, |(path, index, ms): (String, u64, u64)| {
            append(&path, &format!("start {index}"))?;
            std::thread::sleep(Duration::from_millis(ms));
            append(&path, &format!("end {index}"))?;
            Ok::<_, String>(std::process::id())
        })
}

/// Holds references it is given; puts objects on its node.
#[derive(Default)]
pub struct Keeper {
    kept: Vec<ObjectRef<Vec<u64>>>,
}

impl Actor for Keeper {
    type Context = Context<Self>;
}

impl RemoteActor for Keeper {
    const NAME: &'static str = "tests.Keeper";
    type Args = ();
    fn from_args(_: ()) -> Self {
        Keeper::default()
    }
}

/// Keep this reference.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Keep(pub ObjectRef<Vec<u64>>);

impl RemoteMessage for Keep {
    const NAME: &'static str = "tests.Keep";
}

impl Handler<Keep> for Keeper {
    type Result = ();
    fn handle(&mut self, Keep(object): Keep, _: &mut Context<Self>) {
        self.kept.push(object);
    }
}

/// The sum of every kept object's numbers.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<u64, String>")]
pub struct SumKept;

impl RemoteMessage for SumKept {
    const NAME: &'static str = "tests.SumKept";
}

impl Handler<SumKept> for Keeper {
    type Result = ResponseFuture<Result<u64, String>>;
    fn handle(&mut self, _: SumKept, _: &mut Context<Self>) -> Self::Result {
        let kept = self.kept.clone();
        Box::pin(async move {
            let mut sum = 0;
            for object in &kept {
                let numbers = object_store::get(object).await.map_err(|e| e.to_string())?;
                sum += numbers.iter().sum::<u64>();
            }
            Ok(sum)
        })
    }
}

/// Drop every kept reference.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "()")]
pub struct Forget;

impl RemoteMessage for Forget {
    const NAME: &'static str = "tests.Forget";
}

impl Handler<Forget> for Keeper {
    type Result = ();
    fn handle(&mut self, _: Forget, _: &mut Context<Self>) {
        self.kept.clear();
    }
}

/// Put `count` objects of `size` pseudo-random bytes on this node.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<ObjectRef<RawBytes>>, String>")]
pub struct PutMany {
    pub count: u64,
    pub size: usize,
}

impl RemoteMessage for PutMany {
    const NAME: &'static str = "tests.PutMany";
}

impl Handler<PutMany> for Keeper {
    type Result = ResponseFuture<Result<Vec<ObjectRef<RawBytes>>, String>>;
    fn handle(&mut self, m: PutMany, _: &mut Context<Self>) -> Self::Result {
        Box::pin(async move {
            let mut refs = Vec::new();
            for seed in 0..m.count {
                let bytes = pattern(seed, m.size);
                refs.push(
                    object_store::put_bytes(&bytes)
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            Ok(refs)
        })
    }
}

/// Read these objects here, all at once, and return their digests.
#[derive(Message, Serialize, Deserialize)]
#[rtype(result = "Result<Vec<u64>, String>")]
pub struct Digests(pub Vec<ObjectRef<RawBytes>>);

impl RemoteMessage for Digests {
    const NAME: &'static str = "tests.Digests";
}

impl Handler<Digests> for Keeper {
    type Result = ResponseFuture<Result<Vec<u64>, String>>;
    fn handle(&mut self, Digests(refs): Digests, _: &mut Context<Self>) -> Self::Result {
        // All at once: objects of another node are pulled side by side.
        Box::pin(async move {
            let gets = refs.iter().map(|object| async move {
                let bytes = object_store::get_bytes(object)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(digest(&bytes))
            });
            futures::future::try_join_all(gets).await
        })
    }
}

/// `size` pseudo-random bytes from `seed` (xorshift).
pub fn pattern(seed: u64, size: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1d ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// FNV-1a of `bytes`.
pub fn digest(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Appends a line to the file `attempts`: how many times a task ran.
fn count_attempt(attempts: &str) -> Result<(), String> {
    append(attempts, &std::process::id().to_string())
}

/// Appends `line` to the file at `path`.
fn append(path: &str, line: &str) -> Result<(), String> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("{path}: {e}"))?;
    writeln!(file, "{line}").map_err(|e| format!("{path}: {e}"))
}
