//! Which programs link libtorch: only those that train (built from the
//! `nimbus-train` crate). The `nimbus` CLI and node daemon, and programs
//! that use actors, tasks and objects only, run on machines with no
//! libtorch: `ldd` lists none for them. Programs that train find theirs
//! (none of their libraries is "not found").

use std::path::{Path, PathBuf};
use std::process::Command;

/// What `ldd` lists for `program`: every shared library it loads.
pub fn libraries(program: &Path) -> String {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .unwrap_or_else(|e| panic!("ldd {}: {e} (ldd comes with glibc)", program.display()));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ldd {}: {listed}{}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    listed
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_nimbus"))
        .parent()
        .unwrap()
        .join("examples")
}

#[test]
fn the_cli_and_programs_that_do_not_train_link_no_libtorch() {
    let mut programs = vec![PathBuf::from(env!("CARGO_BIN_EXE_nimbus"))];
    for example in ["custom_actor", "tasks", "local_cluster", "microbench"] {
        programs.push(examples().join(example));
    }
    for program in programs {
        assert!(
            program.exists(),
            "{} is not built: `cargo build --workspace --examples` first (`make test` does)",
            program.display()
        );
        let listed = libraries(&program);
        assert!(
            !listed.contains("libtorch") && !listed.contains("libc10"),
            "{} links libtorch:\n{listed}",
            program.display()
        );
    }
}

#[test]
fn programs_that_train_find_their_libtorch() {
    for example in ["train_mnist", "rl_cartpole"] {
        let program = examples().join(example);
        let listed = libraries(&program);
        assert!(
            listed.contains("libtorch_cpu"),
            "{} does not link libtorch:\n{listed}",
            program.display()
        );
        assert!(
            !listed.contains("not found"),
            "{} cannot load a library:\n{listed}",
            program.display()
        );
    }
}
