//! Gives every binary of this package (its examples, tests and benches) an
//! rpath to the libtorch it was built against, so they run with no
//! LD_LIBRARY_PATH set, and publishes that directory to the build scripts
//! of crates that depend on nimbus-train (`DEP_NIMBUS_TRAIN_LIBTORCH_LIB`),
//! so a user's program gets the same rpath from one line of its own
//! `build.rs` (README.md, "Programs that train"). torch-sys publishes the
//! directory as `DEP_TCH_LIBTORCH_LIB` (its `links` key is `tch`).
//!
//! With the `cuda` feature, binaries must also keep `libtorch_cuda.so`
//! NEEDED: no Rust code calls into it (libtorch registers its CUDA
//! backend from that library's static initialisers), so the linker's
//! `--as-needed` drops it and libtorch then sees no CUDA device. torch-sys
//! cannot pass a linker flag to its dependents' binaries, so this script
//! adds [`CUDA_LINK_ARG`] to this package's and publishes it
//! (`DEP_NIMBUS_TRAIN_CUDA_LINK_ARG`) for a user's `build.rs` to add too.

/// Links `libtorch_cuda.so` whether or not a symbol of it is referenced.
const CUDA_LINK_ARG: &str = "-Wl,--no-as-needed,-ltorch_cuda,--as-needed";

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:libtorch_lib={lib}");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg={CUDA_LINK_ARG}");
        println!("cargo:cuda_link_arg={CUDA_LINK_ARG}");
    } else {
        println!(
            "cargo:warning=nimbus-train's `cuda` feature, but the libtorch in {lib} has no libtorch_cuda.so (a CPU build): GPU workers will find no CUDA device; build against a CUDA libtorch (LIBTORCH)"
        );
    }
}
