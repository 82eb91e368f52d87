//! Gives every binary of this package (its examples, tests and benches) an
//! rpath to the libtorch it was built against, so they run with no
//! LD_LIBRARY_PATH set, and publishes that directory to the build scripts
//! of crates that depend on nimbus-train (`DEP_NIMBUS_TRAIN_LIBTORCH_LIB`),
//! so a user's program gets the same rpath from one line of its own
//! `build.rs` (README.md, "Programs that train"). torch-sys publishes the
//! directory as `DEP_TCH_LIBTORCH_LIB` (its `links` key is `tch`).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:libtorch_lib={lib}");
    }
}
