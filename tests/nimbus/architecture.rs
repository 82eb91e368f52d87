//! ARCHITECTURE.md and src/lib.rs stay true: every source path the map
//! names exists, and every top-level module imports only what its layer
//! allows.

use std::path::Path;

#[test]
fn every_path_architecture_md_links_or_heads_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut named = Vec::new();
    for (start, _) in doc.match_indices("](src/") {
        let rest = &doc[start + 2..];
        named.push(&rest[..rest.find(')').unwrap()]);
    }
    for line in doc.lines() {
        if let Some(path) = line.strip_prefix("### `").and_then(|l| l.strip_suffix('`')) {
            named.push(path);
        }
    }
    assert!(named.len() >= 8, "found only {named:?}");
    for path in named {
        assert!(
            root.join(path).exists(),
            "ARCHITECTURE.md names {path}, which does not exist"
        );
    }
}

/// The most lines ARCHITECTURE.md may have: it is the map; measurements
/// and design notes live in `docs/` and in the module docs it links.
const ARCHITECTURE_MAX_LINES: usize = 450;

#[test]
fn architecture_md_stays_a_map() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let lines = doc.lines().count();
    assert!(
        lines <= ARCHITECTURE_MAX_LINES,
        "ARCHITECTURE.md has {lines} lines, over {ARCHITECTURE_MAX_LINES}: move measurements and design notes to docs/ or to the module docs of the code they describe"
    );
    for (start, _) in doc.match_indices("](docs/") {
        let rest = &doc[start + 2..];
        let path = &rest[..rest.find(')').unwrap()];
        assert!(
            root.join(path).exists(),
            "ARCHITECTURE.md links {path}, which does not exist"
        );
    }
}

/// What each top-level module of `src/` may import (`crate::NAME`), from
/// the bottom layer up. `src/lib.rs` lists the same layers; a new import
/// outside this table is a design change: change the table, lib.rs and
/// ARCHITECTURE.md together, never only the code.
#[rustfmt::skip]
const ALLOWED_IMPORTS: &[(&str, &[&str])] = &[
    ("metrics", &[]),
    ("wire", &[]),
    ("transport", &["wire"]),
    ("host", &["transport"]),
    ("cluster", &["host", "transport", "wire"]),
    ("client", &["cluster", "host", "transport", "wire"]),
    ("dashboard", &["metrics", "client", "cluster", "transport", "host"]),
    ("runtime", &["metrics", "client", "cluster", "host", "transport", "wire"]),
    ("library", &["runtime", "client", "cluster", "host", "transport"]),
    ("launch", &["client", "cluster", "transport"]),
    ("autoscaler", &["runtime", "client", "cluster", "host", "transport", "wire"]),
    ("head", &["launch", "cluster", "host", "transport", "wire"]),
    ("object_store", &["head", "runtime", "client", "cluster", "host", "transport", "wire"]),
    ("node", &["head", "object_store", "runtime", "metrics", "client", "cluster", "host", "transport", "wire"]),
    ("local", &["runtime", "client", "cluster", "host", "transport", "wire"]),
    ("actor", &["launch", "runtime", "client", "cluster", "transport", "wire"]),
    ("placement", &["actor", "runtime", "client", "cluster", "transport"]),
    ("task", &["placement", "actor", "object_store", "runtime", "client", "cluster", "transport"]),
    ("train", &["actor", "cluster", "transport"]),
    ("tune", &["library", "actor", "cluster"]),
    ("worker", &["actor", "object_store", "runtime", "cluster", "host", "transport", "wire"]),
    ("chaos", &["train", "actor", "local", "client", "cluster", "host", "transport", "wire"]),
    ("cli", &["chaos", "train", "local", "node", "autoscaler", "head", "dashboard", "runtime", "client", "cluster", "host", "transport"]),
    ("driver", &["cli", "worker", "task", "local", "node", "object_store", "runtime", "client", "cluster", "host", "transport", "wire"]),
    ("testing", &["local"]),
];

/// The top-level module a file of `src/` belongs to (`None`: the crate root
/// or a binary).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let first = file.strip_prefix(src).ok()?.components().next()?;
    let name = first.as_os_str().to_str()?;
    match name.strip_suffix(".rs") {
        Some("lib") | Some("main") => None,
        Some(module) => Some(module.to_string()),
        None if name == "bin" => None,
        None => Some(name.to_string()),
    }
}

/// The first segments of every `crate::...` path in `code` (comments
/// removed), `use crate::{a, b::c}` groups included.
fn crate_paths(code: &str) -> Vec<String> {
    paths_under(code, "crate::")
}

/// The first segments of every path in `code` that starts with `root`
/// (`crate::`, `nimbus::`), comments removed, groups included.
fn paths_under(code: &str, root: &str) -> Vec<String> {
    let code: String = code
        .lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    for (at, _) in code.match_indices(root) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + root.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let (mut depth, mut part) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.push(ident(part.trim()));
                        part.clear();
                        continue;
                    }
                    _ => {}
                }
                part.push(c);
            }
            found.push(ident(part.trim()));
        } else {
            found.push(ident(rest));
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn top_level_modules_import_only_what_the_layer_table_allows() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed: std::collections::HashMap<&str, &[&str]> =
        ALLOWED_IMPORTS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut outside = Vec::new();
    let mut modules = std::collections::BTreeSet::new();
    let mut used_edges = std::collections::BTreeSet::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        modules.insert(module.clone());
        let Some(may) = allowed.get(module.as_str()) else {
            outside.push(format!("{module} is not in ALLOWED_IMPORTS"));
            continue;
        };
        let code = std::fs::read_to_string(file).unwrap();
        for used in crate_paths(&code) {
            let is_module = allowed.contains_key(used.as_str());
            if is_module && used != module {
                used_edges.insert((module.clone(), used.clone()));
            }
            if is_module && used != module && !may.contains(&used.as_str()) {
                let file = file.strip_prefix(&src).unwrap().display();
                outside.push(format!("{module} imports {used} (src/{file})"));
            }
        }
    }
    outside.sort();
    outside.dedup();
    assert!(
        outside.is_empty(),
        "imports outside the layer table:\n{}",
        outside.join("\n")
    );
    let listed: std::collections::BTreeSet<String> =
        allowed.keys().map(|m| m.to_string()).collect();
    assert_eq!(
        modules, listed,
        "ALLOWED_IMPORTS lists exactly the modules of src/"
    );
    // The table is the map: an edge no file uses is a stale one.
    let unused: Vec<String> = ALLOWED_IMPORTS
        .iter()
        .flat_map(|(module, may)| may.iter().map(move |m| (*module, *m)))
        .filter(|(module, m)| !used_edges.contains(&(module.to_string(), m.to_string())))
        .map(|(module, m)| format!("{module} -> {m}"))
        .collect();
    assert!(
        unused.is_empty(),
        "allowed imports no file uses (remove them from ALLOWED_IMPORTS and ARCHITECTURE.md):\n{}",
        unused.join("\n")
    );
}

/// What a library crate built on nimbus (`nimbus-train`, `nimbus-data`,
/// `nimbus-serve`, `nimbus-rl`) may not use of it: the runtime's internals and the raw
/// control protocol. It uses the user API and `nimbus::library`, the seam
/// written for it.
const NOT_FOR_LIBRARIES: &[&str] = &[
    "runtime",
    "transport",
    "wire",
    "head",
    "node",
    "launch",
    "client",
    "local",
    "chaos",
    "driver",
    "cli",
    "dashboard",
    "metrics",
    "testing",
];
/// Names of the control protocol and the process context a library reaches
/// only through `nimbus::library`.
const PROTOCOL_NAMES: &[&str] = &[
    "ControlRequest",
    "ControlReply",
    "FaultRequest",
    "JobRequest",
    "DirectoryRequest",
    "ObjectRequest",
    "WorkerRequest",
    "MembershipRequest",
    "FaultReply",
    "JobReply",
    "DirectoryReply",
    "ObjectReply",
    "WorkerReply",
    "MembershipReply",
    "Subsystem",
    "StateRequest",
    "StateReply",
    "ProcessContext",
];

#[test]
fn library_crates_use_nimbus_only_through_its_api_and_the_library_seam() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut outside = Vec::new();
    for library in [
        "nimbus-train/src",
        "nimbus-data/src",
        "nimbus-serve/src",
        "nimbus-rl/src",
    ] {
        let mut files = Vec::new();
        rust_files(&root.join(library), &mut files);
        assert!(!files.is_empty(), "no sources in {library}");
        for file in &files {
            let code = std::fs::read_to_string(file).unwrap();
            let shown = file.strip_prefix(root).unwrap().display().to_string();
            for used in paths_under(&code, "nimbus::") {
                if NOT_FOR_LIBRARIES.contains(&used.as_str()) {
                    outside.push(format!("{shown} uses nimbus::{used}"));
                }
            }
            let code: String = code
                .lines()
                .map(|line| line.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            for name in PROTOCOL_NAMES {
                if code.contains(name) {
                    outside.push(format!("{shown} names {name}"));
                }
            }
        }
    }
    outside.sort();
    outside.dedup();
    assert!(
        outside.is_empty(),
        "a library crate reaches past nimbus's API and nimbus::library:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_layer_table_has_no_cycle() {
    // Each module may import only modules listed before it.
    for (index, (module, may)) in ALLOWED_IMPORTS.iter().enumerate() {
        for used in *may {
            let below = ALLOWED_IMPORTS[..index].iter().any(|(m, _)| m == used);
            assert!(below, "{module} may import {used}, which is not below it");
        }
    }
}

#[test]
fn the_import_scan_sees_grouped_and_inline_paths() {
    let code = "use crate::{actor::{A, B}, node};\n// crate::chaos\nlet x = crate::task::submit();";
    assert_eq!(crate_paths(code), ["actor", "node", "task"]);
    let code = "use nimbus::{library, runtime::X};\nuse my_nimbus::wire;\nnimbus_train::a();";
    assert_eq!(paths_under(code, "nimbus::"), ["library", "runtime"]);
}

/// What `src/wire` (the wire format: frames, messages, identities) may not
/// name outside its tests: it does no I/O and reads no clock, so a fuzzer,
/// a simulation or another crate can use it as plain data (#50: it did
/// async frame I/O and read the clock).
const NOT_IN_WIRE: &[&str] = &[
    "tokio",
    "std::fs",
    "std::net::Tcp",
    "std::thread",
    "async fn",
    "::now(",
    "SystemTime",
    "Instant",
];

#[test]
fn wire_names_no_file_system_async_runtime_or_clock() {
    assert_names_none(
        "src/wire",
        NOT_IN_WIRE,
        "the wire format does no I/O and reads no clock (that is crate::transport's)",
    );
}

/// What `src/cluster` (the cluster's shared types and protocol) may not
/// name outside its tests: the machine's files, `/proc` and processes are
/// `crate::host`'s (#50: cluster did file I/O and host probing).
const NOT_IN_CLUSTER: &[&str] = &["std::fs", "/proc", "std::process", "libc::"];

#[test]
fn cluster_names_no_file_system_or_processes() {
    assert_names_none(
        "src/cluster",
        NOT_IN_CLUSTER,
        "the cluster's types touch no files or processes (that is crate::host's)",
    );
}

/// Fails when a source file under `dir` names one of `names` before its
/// tests, saying `why`.
fn assert_names_none(dir: &str, names: &[&str], why: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(files.len() >= 3, "found only {files:?}");
    for file in files {
        let code = std::fs::read_to_string(&file).unwrap();
        let code = code.split("#[cfg(test)]").next().unwrap_or_default();
        for name in names {
            assert!(
                !code.contains(name),
                "{} names {name}: {why}",
                file.display()
            );
        }
    }
}
