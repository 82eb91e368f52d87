//! Gives this package's binaries (its example and tests) an rpath to the
//! libtorch nimbus-train was built against, as README.md's "Programs that
//! train" tells a user's own `build.rs` to do.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_NIMBUS_TRAIN_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_NIMBUS_TRAIN_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
