//! What a training program needs so that it finds libtorch with no
//! LD_LIBRARY_PATH: an rpath to the libtorch nimbus-train was built
//! against, which nimbus-train publishes to its dependents' build scripts;
//! and, with nimbus-train's `cuda` feature, the link argument that keeps
//! libtorch's CUDA library linked (without it libtorch sees no GPU).

fn main() {
    if let Ok(lib) = std::env::var("DEP_NIMBUS_TRAIN_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
    if let Ok(arg) = std::env::var("DEP_NIMBUS_TRAIN_CUDA_LINK_ARG") {
        println!("cargo:rustc-link-arg={arg}");
    }
}
