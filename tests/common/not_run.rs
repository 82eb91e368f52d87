//! A test that cannot run on this machine (no root for simulated hosts, no
//! `ip`, a libtorch without CUDA) must not pass as if it had run.
//!
//! 1. It calls [`cannot_run`] with its reason and returns.
//! 2. Unless [`ALLOW_NOT_RUN`] is set, and always under CI (`CI` set to
//!    anything but `false` or `0`), that panics: the test fails, naming
//!    what it lacked and the setting that lets it pass.
//! 3. Where it may pass, it says so on stderr and appends one line to the
//!    file [`NOT_RUN_LOG`] names, if any: `make test` counts those lines
//!    and prints how many tests did not run at its end (stderr of a passing
//!    test is hidden by the test runner).

use std::io::Write;

/// Set (to anything) to let a test that cannot run here pass, outside CI.
pub const ALLOW_NOT_RUN: &str = "NIMBUS_ALLOW_NOT_RUN";

/// A file each test that did not run appends one line to.
pub const NOT_RUN_LOG: &str = "NIMBUS_NOT_RUN_LOG";

/// The calling test cannot run here because of `why` (steps 2 and 3).
pub fn cannot_run(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0");
    let allowed = std::env::var_os(ALLOW_NOT_RUN).is_some();
    if ci || !allowed {
        let how = if ci {
            "under CI every test must run".to_string()
        } else {
            format!("set {ALLOW_NOT_RUN}=1 to let it pass without running")
        };
        panic!("{test} cannot run here: {why} ({how})");
    }
    eprintln!("*** {test} did NOT run: {why} ***");
    if let Some(path) = std::env::var_os(NOT_RUN_LOG) {
        let line = format!("{test}: {why}\n");
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut log| log.write_all(line.as_bytes()));
        if let Err(e) = appended {
            panic!(
                "{test} did not run and cannot say so in {}: {e}",
                std::path::Path::new(&path).display()
            );
        }
    }
}
