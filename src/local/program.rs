//! Which program a local cluster's nodes run: the `nimbus` binary at
//! `$NIMBUS_BIN` or beside this one; else this program with [`NODE_ARG`]
//! (a program that calls `nimbus::init` runs the `nimbus` command line in
//! that role); else `nimbus` on `PATH`.

use std::path::PathBuf;

use crate::runtime::NODE_ARG;

use super::LocalClusterError;

/// The nodes' program and the arguments before `nimbus`'s own; this
/// program itself only when `this_program`.
pub(super) fn find_program(
    this_program: bool,
) -> Result<(PathBuf, Vec<String>), LocalClusterError> {
    if let Some(program) = std::env::var_os("NIMBUS_BIN") {
        return Ok((program.into(), Vec::new()));
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let on_path = std::env::var_os("PATH").unwrap_or_default();
    let beside = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("nimbus"));
    let on_path = std::env::split_paths(&on_path).map(|dir| dir.join("nimbus"));
    let (beside, on_path): (Vec<PathBuf>, Vec<PathBuf>) = (beside.collect(), on_path.collect());
    if let Some(program) = beside.iter().find(|c| c.is_file()) {
        return Ok((program.clone(), Vec::new()));
    }
    if this_program && exe.is_file() {
        return Ok((exe, vec![NODE_ARG.to_string()]));
    }
    if let Some(program) = on_path.iter().find(|c| c.is_file()) {
        return Ok((program.clone(), Vec::new()));
    }
    let looked: Vec<String> = beside
        .iter()
        .chain(&on_path)
        .map(|c| c.display().to_string())
        .collect();
    Err(LocalClusterError::ProgramNotFound(looked.join(", ")))
}
