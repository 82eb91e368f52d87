//! Fuzzing every decoder that reads bytes from the network or from disk,
//! on stable Rust: a seeded mutation fuzzer with a corpus per target. (The
//! bulk streams' TLS record layer, which this binary cannot reach, is
//! fuzzed in its own module's tests: `src/transport/records.rs`.)
//!
//! `cargo test --test fuzz` (part of `make test`; nimbus-train's own
//! `--test fuzz` fuzzes the checkpoint manifest with this harness) runs a
//! short pass;
//! `make fuzz` a long one (`NIMBUS_FUZZ_INPUTS=1000000` per target, in
//! release). What it checks, per target:
//!
//! 1. Replay the kept regression inputs (`tests/fuzz/regressions/TARGET/`).
//! 2. Then `NIMBUS_FUZZ_INPUTS` (default 100,000) inputs, each a corpus
//!    entry mutated one to four times (bit flips, bytes set to values that
//!    matter to MessagePack, JSON and TOML, inserted, deleted or repeated
//!    ranges, length fields set to extremes, truncation, splicing). The
//!    corpus starts from valid encodings (half the inputs start from
//!    one of them); an input whose outcome (success,
//!    or its error with the numbers taken out) is new joins it, up to
//!    `CORPUS_MAX`: a cheap stand-in for coverage, so the search reaches
//!    the decoders' deeper paths.
//! 3. A panic is a failure: the input is written to
//!    `target/fuzz-crashers/TARGET/`, named by its hash (move it into the
//!    regressions once fixed). An input taking over `STUCK_AFTER` (10 s)
//!    is a failure too (a hang).
//! 4. Memory stays bounded: the process's peak RSS at the end must be
//!    under `MAX_RSS_MIB` (1 GiB).
//!
//! The seed is `NIMBUS_FUZZ_SEED` (default 1, so a CI run is repeatable;
//! `make fuzz` takes the time, and prints it); each target prints `fuzz.TARGET: N inputs, P panics, S s`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Inputs per target when `NIMBUS_FUZZ_INPUTS` is not set.
const DEFAULT_INPUTS: u64 = 100_000;
/// The most corpus entries a target keeps.
const CORPUS_MAX: usize = 4096;
/// The longest input the mutations build.
const INPUT_MAX: usize = 64 << 10;
/// An input running longer than this is a hang.
const STUCK_AFTER: Duration = Duration::from_secs(10);
/// The peak RSS allowed at the end, in MiB.
const MAX_RSS_MIB: i64 = 1024;

/// Byte values that change how MessagePack, JSON or TOML read what follows.
const INTERESTING_BYTES: &[u8] = &[
    0x00, 0x01, 0x7f, 0x80, 0xff, 0xc0, 0xc1, 0xc2, 0xc3, 0xc4, 0xc5, 0xc6, 0xc7, 0xc8, 0xc9, 0xca,
    0xcb, 0xcf, 0xd3, 0xd9, 0xda, 0xdb, 0xdc, 0xdd, 0xde, 0xdf, 0x90, 0x9f, 0xa0, 0xbf, b'{', b'}',
    b'[', b']', b'"', b'\\', b':', b',', b'=', b'\n', b'.', b'-', b'e', b'0',
];

/// Lengths that sit at the edges of the decoders' limits.
const INTERESTING_U32: &[u32] = &[
    0,
    1,
    0x7f,
    0x80,
    0xffff,
    0x1_0000,
    0x00ff_ffff,
    0x0100_0000,
    0x7fff_ffff,
    0xffff_ffff,
];

/// What a decoder made of an input: nothing, or its error in words.
pub type Outcome = Result<(), String>;

/// One decoder under test.
pub struct Target {
    /// Its name in the output and in the crashers' directory.
    pub name: &'static str,
    /// Valid inputs to start from.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// The decoder: `Ok`, or its error in words.
    pub decode: fn(&[u8]) -> Outcome,
}

/// Fuzzes `targets` (those whose name contains the first argument, if
/// any); panics if a decoder did, or memory grew past the bound.
pub fn run(targets: &[Target]) {
    let inputs = env_u64("NIMBUS_FUZZ_INPUTS").unwrap_or(DEFAULT_INPUTS);
    let seed = env_u64("NIMBUS_FUZZ_SEED").unwrap_or(1);
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!("fuzz.seed: {seed}");
    // Panics are the findings: report them once, not with a hook's noise.
    std::panic::set_hook(Box::new(|_| {}));
    let watch = Watchdog::start();
    let mut failed = Vec::new();
    for target in targets {
        if filter.as_deref().is_some_and(|f| !target.name.contains(f)) {
            continue;
        }
        let crashers = fuzz(target, inputs, seed, &watch);
        if !crashers.is_empty() {
            failed.push((target.name, crashers));
        }
    }
    let rss = peak_rss_mib();
    println!("fuzz.peak_rss: {rss} MiB");
    let _ = std::panic::take_hook();
    for (name, crashers) in &failed {
        eprintln!("{name}: {} inputs panicked:", crashers.len());
        for path in crashers {
            eprintln!("  {}", path.display());
        }
    }
    assert!(failed.is_empty(), "decoders panicked (inputs listed above)");
    assert!(
        rss < MAX_RSS_MIB,
        "peak RSS {rss} MiB, over {MAX_RSS_MIB} MiB"
    );
}

/// Steps 1–3 for one target; returns the inputs that panicked.
fn fuzz(target: &Target, inputs: u64, seed: u64, watch: &Watchdog) -> Vec<PathBuf> {
    let started = Instant::now();
    let mut crashers = Vec::new();
    let mut run = |input: &[u8]| -> Option<String> {
        watch.running(target.name, input);
        match std::panic::catch_unwind(|| (target.decode)(input)) {
            Ok(outcome) => Some(outcome_key(outcome)),
            Err(_) => {
                crashers.push(save_crasher(target.name, input));
                None
            }
        }
    };
    let regressions = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz/regressions")
        .join(target.name);
    let mut replayed = 0;
    if let Ok(entries) = std::fs::read_dir(&regressions) {
        for entry in entries.flatten() {
            run(&std::fs::read(entry.path()).unwrap());
            replayed += 1;
        }
    }
    let mut corpus = (target.seeds)();
    let seeds = corpus.len();
    assert!(seeds > 0, "{}: no seeds", target.name);
    for seed_input in &corpus {
        if let Err(e) = (target.decode)(seed_input) {
            panic!("{}: a seed does not decode: {e}", target.name);
        }
    }
    let mut outcomes = HashSet::from([outcome_key(Ok(()))]);
    let mut rng = StdRng::seed_from_u64(seed ^ hash(target.name.as_bytes()));
    for _ in 0..inputs {
        let input = mutate(&mut rng, &corpus, seeds);
        if let Some(outcome) = run(&input) {
            if corpus.len() < CORPUS_MAX && outcomes.insert(outcome) {
                corpus.push(input);
            }
        }
    }
    println!(
        "fuzz.{}: {} inputs, {} panics, {:.1} s ({replayed} regressions replayed, {} outcomes, corpus {})",
        target.name,
        inputs + replayed,
        crashers.len(),
        started.elapsed().as_secs_f64(),
        outcomes.len(),
        corpus.len()
    );
    crashers
}

/// An outcome with its numbers taken out (offsets and lengths would make
/// every input new).
fn outcome_key(outcome: Outcome) -> String {
    match outcome {
        Ok(()) => "ok".into(),
        Err(e) => e.chars().filter(|c| !c.is_ascii_digit()).collect(),
    }
}

/// A corpus entry (half the time one of the `seeds` valid ones it starts
/// with), mutated one to four times.
fn mutate(rng: &mut StdRng, corpus: &[Vec<u8>], seeds: usize) -> Vec<u8> {
    let pick = if rng.random() { seeds } else { corpus.len() };
    let mut input = corpus[rng.random_range(0..pick)].clone();
    for _ in 0..rng.random_range(1..=4) {
        let len = input.len();
        let at = if len == 0 {
            0
        } else {
            rng.random_range(0..len)
        };
        match rng.random_range(0..9) {
            0 if len > 0 => input[at] ^= 1 << rng.random_range(0..8),
            1 if len > 0 => input[at] = rng.random(),
            2 if len > 0 => {
                input[at] = INTERESTING_BYTES[rng.random_range(0..INTERESTING_BYTES.len())]
            }
            3 => {
                let bytes: Vec<u8> = (0..rng.random_range(1..8)).map(|_| rng.random()).collect();
                input.splice(at..at, bytes);
            }
            4 if len > 0 => {
                let end = (at + rng.random_range(1..16)).min(len);
                input.drain(at..end);
            }
            5 if len > 0 => {
                let end = (at + rng.random_range(1..32)).min(len);
                let range = input[at..end].to_vec();
                for _ in 0..rng.random_range(1..8) {
                    input.splice(at..at, range.iter().copied());
                }
            }
            6 if len >= 4 => {
                let at = rng.random_range(0..=len - 4);
                let value = INTERESTING_U32[rng.random_range(0..INTERESTING_U32.len())];
                input[at..at + 4].copy_from_slice(&value.to_be_bytes());
            }
            7 => input.truncate(at),
            8 => {
                let other = &corpus[rng.random_range(0..corpus.len())];
                let from = if other.is_empty() {
                    0
                } else {
                    rng.random_range(0..other.len())
                };
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
        input.truncate(INPUT_MAX);
    }
    input
}

/// Writes an input that panicked where a person can find it.
fn save_crasher(target: &str, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/fuzz-crashers")
        .join(target);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{:016x}.bin", hash(input)));
    std::fs::write(&path, input).unwrap();
    path
}

fn hash(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value:?} is not a whole number")),
    )
}

/// The process's peak resident set, in MiB.
fn peak_rss_mib() -> i64 {
    // SAFETY: an all-zero `rusage` is a valid out-parameter.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` outlives the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss / 1024
}

/// Step 3's hang check: a thread that fails the run when one input takes
/// longer than `STUCK_AFTER`, writing it as a crasher first.
struct Watchdog {
    progress: Arc<AtomicU64>,
    current: Arc<Mutex<(&'static str, Vec<u8>)>>,
}

impl Watchdog {
    fn start() -> Self {
        let progress = Arc::new(AtomicU64::new(0));
        let current = Arc::new(Mutex::new(("", Vec::new())));
        let (seen, input) = (progress.clone(), current.clone());
        std::thread::spawn(move || {
            let mut last = (u64::MAX, Instant::now());
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let now = seen.load(Ordering::Relaxed);
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > STUCK_AFTER {
                    let (target, stuck) = input.lock().unwrap().clone();
                    let path = save_crasher(target, &stuck);
                    eprintln!(
                        "{target}: an input hung for {STUCK_AFTER:?}: {}",
                        path.display()
                    );
                    std::process::exit(1);
                }
            }
        });
        Watchdog { progress, current }
    }

    fn running(&self, target: &'static str, input: &[u8]) {
        let mut current = self.current.lock().unwrap();
        current.0 = target;
        current.1.clear();
        current.1.extend_from_slice(input);
        self.progress.fetch_add(1, Ordering::Relaxed);
    }
}
