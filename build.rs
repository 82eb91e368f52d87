//! Gives every binary of this package (the CLI, examples, tests, benches)
//! an rpath to the libtorch it was built against, so it runs with no
//! LD_LIBRARY_PATH set. torch-sys publishes that directory as
//! `DEP_TCH_LIBTORCH_LIB` (its `links` key is `tch`).

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}
