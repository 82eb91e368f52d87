#!/usr/bin/env bash
# `make demo`: a 3-node local cluster (a node killed and detected), then
# MNIST on 2 workers surviving a crash, in timed phases.
#
# 1. torch installs in the background (unless LIBTORCH is set) while the
#    CLI and the cluster example, which need no libtorch, build and run.
# 2. Then the training example builds and trains.
# 3. The time per phase is printed and held against README.md's promise
#    (scripts/phases.sh).
#
# It builds only what it runs, in the profile `make test` builds in (`dev`,
# whose opt-level Cargo.toml sets), and with the whole workspace's features
# (`--workspace` with the targets named): the second build then reuses
# nimbus and its dependencies from the first (with `-p nimbus-train`, cargo
# built them again with that package's features), and a `make test` after
# it reuses both. The programs' own lines are the demo: their logs show errors only
# (NIMBUS_LOG=error, unless set), where warnings would repeat those lines.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phases.sh
export NIMBUS_LOG="${NIMBUS_LOG:-error}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Step 1.
if [ -z "${LIBTORCH:-}" ]; then
  scripts/ensure-torch.sh >"$work/torch.python" 2>"$work/torch" &
  torch=$!
fi
phase "build the cluster example (torch installing beside it)" \
  cargo build --workspace --bin nimbus --example local_cluster
phase "3-node cluster, a node killed" target/debug/examples/local_cluster
use_torch() {
  if [ -n "${LIBTORCH:-}" ]; then return 0; fi
  if ! wait "$torch"; then
    cat "$work/torch" >&2
    return 1
  fi
  local python
  python=$(cat "$work/torch.python")
  export LIBTORCH_USE_PYTORCH=1 PATH="$(dirname "$python"):$PATH"
}
phase "torch installed" use_torch

# Step 2.
phase "build the training example" cargo build --workspace --example train_mnist
phase "MNIST on 2 workers, one crashing" \
  target/debug/examples/train_mnist --workers 2 --epochs 2 --fail-at-step 60

# Step 3.
phases_report "make demo" "make demo "
