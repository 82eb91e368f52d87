//! The one line a training program needs so that it finds libtorch with
//! no LD_LIBRARY_PATH: an rpath to the libtorch nimbus-train was built
//! against, which nimbus-train publishes to its dependents' build scripts.

fn main() {
    if let Ok(lib) = std::env::var("DEP_NIMBUS_TRAIN_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
