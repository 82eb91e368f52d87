//! Secrets and user data: the token never shows in a process list, and a
//! node never deletes a directory it did not create.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use tempfile::TempDir;

use crate::cli::{free_port, nimbus, succeeds, text, StopOnDrop};
use crate::support::cluster;

/// Every process on this machine whose arguments contain `secret`.
fn processes_showing(secret: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let args = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args = String::from_utf8_lossy(&args).replace('\0', " ");
            args.contains(secret)
                .then(|| format!("pid {}: {args}", entry.file_name().to_string_lossy()))
        })
        .collect()
}

#[test]
fn the_join_token_is_in_no_process_arguments() {
    let home = TempDir::new().unwrap();
    let home = home.path();
    let _stop = StopOnDrop(home);
    let port = free_port().to_string();
    let ip = ["--node-ip-address", "127.0.0.1"];
    let out = succeeds(
        home,
        &[&["start", "--head", "--port", &port][..], &ip].concat(),
    );
    let address = format!("127.0.0.1:{port}");
    let token = out
        .lines()
        .find_map(|l| l.strip_prefix("token: "))
        .expect("a token line")
        .to_string();
    // Typed on the command line: the short-lived `start` shows it, the node
    // it leaves running does not.
    let typed = ["start", "--address", &address, "--token", &token];
    let out = succeeds(home, &[&typed[..], &ip].concat());
    assert!(
        !out.contains(&token),
        "a joining node prints the token: {out}"
    );
    // From a private file.
    let file = home.join("join-token");
    std::fs::write(&file, &token).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file = file.to_str().unwrap();
    let from_file = ["start", "--address", &address, "--token-file", file];
    succeeds(home, &[&from_file[..], &ip].concat());
    let status = nimbus(home, &["status", "--json", "--token-file", file]);
    let json: serde_json::Value =
        serde_json::from_slice(&status.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&status)));
    assert_eq!(json["nodes"].as_array().unwrap().len(), 3, "{json}");
    assert_eq!(processes_showing(&token), Vec::<String>::new());

    let missing = nimbus(home, &["status", "--token-file", "/nonexistent/token"]);
    assert!(!missing.status.success());
    assert!(
        text(&missing).contains("cannot read the token file /nonexistent/token"),
        "{}",
        text(&missing)
    );
}

#[test]
fn a_local_clusters_nodes_get_the_token_outside_their_arguments() {
    let cluster = cluster(2);
    let token = cluster.token().to_string();
    assert_eq!(processes_showing(&token), Vec::<String>::new());
}

#[test]
fn a_node_removes_only_its_own_directory_inside_the_spill_directory() {
    let mut cluster = cluster(1);
    let user = TempDir::new().unwrap();
    let spill = user.path().join("nvme");
    std::fs::create_dir(&spill).unwrap();
    std::fs::write(spill.join("dataset.bin"), b"the user's data").unwrap();
    let spill_arg = spill.to_str().unwrap();
    let node = cluster
        .add_node(&["--object-spill-dir", spill_arg])
        .unwrap();
    let pid = cluster.node(node).unwrap().pid();
    let own = spill.join(format!("nimbus-node-{node}-{pid}"));
    assert!(
        own.is_dir(),
        "the node spills into {}: {:?}",
        own.display(),
        std::fs::read_dir(&spill).unwrap().collect::<Vec<_>>()
    );
    assert!(
        cluster.stop(node, Duration::from_secs(10)).unwrap(),
        "{}",
        cluster.log(node)
    );
    assert_eq!(
        std::fs::read(spill.join("dataset.bin")).unwrap(),
        b"the user's data"
    );
    assert!(!own.exists(), "{} is left behind", own.display());
}
