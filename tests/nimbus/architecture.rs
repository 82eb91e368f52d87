//! ARCHITECTURE.md stays true: every source path it names exists.

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
