//! Fuzzing the decoders of nimbus-train that read what a file holds: the
//! checkpoint manifest. The harness is nimbus's (`tests/fuzz/harness.rs`,
//! which says what it checks); `cargo test -p nimbus-train --test fuzz`.

// Tests: a failed unwrap is the failure report, and their items are
// public to their own modules only.
#![allow(clippy::unwrap_used, unreachable_pub)]

#[path = "../../../tests/fuzz/harness.rs"]
mod harness;

use harness::{Outcome, Target};

const ALL: &[Target] = &[Target {
    name: "checkpoint_manifest",
    seeds: manifests,
    decode: manifest,
}];

fn main() {
    harness::run(ALL)
}

fn manifests() -> Vec<Vec<u8>> {
    let manifest = nimbus_train::checkpoint::Manifest {
        format: 1,
        index: 3,
        attempt: 1,
        metrics: [("loss".to_string(), 0.25)].into(),
        values: [("epoch".to_string(), serde_json::json!(2))].into(),
        tensors_bytes: 1024,
        tensors_sha256: "ab".repeat(32),
    };
    vec![serde_json::to_vec_pretty(&manifest).unwrap()]
}

fn manifest(input: &[u8]) -> Outcome {
    nimbus_train::checkpoint::Manifest::parse(input)
        .map(drop)
        .map_err(|e| e.to_string())
}
