//! What a GPU build needs, checked without a GPU (`make test` runs it:
//! `cargo test -p nimbus-train --features cuda --test cuda`):
//! - a program that trains keeps `libtorch_cuda.so` NEEDED, else libtorch
//!   sees no CUDA device (this test's own binary, which nimbus-train's
//!   `build.rs` links as it links a user's program through
//!   `DEP_NIMBUS_TRAIN_CUDA_LINK_ARG`);
//! - NCCL is found beside the libtorch in use (a torch wheel's
//!   `nvidia/nccl/lib/libnccl.so.2`, a name cudarc never tries), or where
//!   `NIMBUS_NCCL_LIB` says, and is new enough for `ncclAvg`.
//!
//! Both need a CUDA libtorch (torch's `+cuXYZ` builds, as
//! `scripts/ensure-torch.sh` installs); with a CPU one they fail, unless
//! not running is allowed outside CI (`tests/common/not_run.rs`).

// Tests, examples and benchmarks: a failed unwrap is the failure report, and
// their items are public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../tests/common/not_run.rs"]
mod not_run;

use std::path::PathBuf;
use std::process::Command;

use nimbus::cluster::Torch;
use nimbus_train::collective::nccl;
use not_run::cannot_run;

/// The libtorch this test loaded, if it is a CUDA build.
fn cuda_libtorch() -> Option<Torch> {
    // Calls into libtorch, so that it is loaded however it was linked.
    eprintln!(
        "CUDA devices libtorch sees here: {}",
        nimbus_train::tch::Cuda::device_count()
    );
    let torch = Torch::loaded().expect("a test of nimbus-train loads libtorch");
    if torch.directory.join("libtorch_cuda.so").exists() {
        Some(torch)
    } else {
        cannot_run(&format!(
            "{} is a libtorch without CUDA",
            torch.directory.display()
        ));
        None
    }
}

#[test]
fn a_program_that_trains_keeps_libtorch_cuda_linked() {
    if cuda_libtorch().is_none() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&me)
        .output()
        .expect("readelf (binutils) runs");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        dynamic.contains("[libtorch_cuda.so]"),
        "{} does not need libtorch_cuda.so:\n{dynamic}",
        me.display()
    );
}

#[test]
fn nccl_is_found_beside_the_libtorch_in_use_and_is_new_enough() {
    let Some(torch) = cuda_libtorch() else { return };
    let wheel = torch
        .directory
        .join("../../nvidia/nccl/lib")
        .join(nccl::SONAME);
    if !wheel.exists() {
        cannot_run(&format!(
            "no NCCL at {} (not a torch wheel's layout)",
            wheel.display()
        ));
        return;
    }
    let loaded = nccl::nccl().unwrap();
    assert_eq!(loaded.path, wheel);
    assert!(loaded.version >= nccl::MIN_VERSION, "{}", loaded.version);
    // A torch 2.11 wheel's NCCL (2.28) makes non-blocking communicators.
    assert!(loaded.version >= nccl::NON_BLOCKING_VERSION);
    assert!(loaded.comm_init_rank_config.is_some());
    eprintln!(
        "NCCL {} from {}",
        nccl::version_text(loaded.version),
        loaded.path.display()
    );
}

#[test]
fn a_library_that_is_not_nccl_is_refused_naming_the_file() {
    // The C library is a library, but not NCCL: it has no ncclGetVersion.
    let libc = PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6");
    if !libc.exists() {
        cannot_run(&format!("no {}", libc.display()));
        return;
    }
    let error = nccl::load(Some(libc.clone()), None).err().unwrap();
    assert!(
        error.contains("is not NCCL 2") && error.contains(&libc.display().to_string()),
        "{error}"
    );
}
