#!/usr/bin/env bash
# `make test` (and CI, through .ci/run): every test, in timed phases.
#
# 1. In the background: Chromium for the dashboard's browser tests,
#    kubernetes-validate (which then checks the manifests), and torch
#    (unless LIBTORCH is set or torch is installed already), while
#    what of the workspace needs no libtorch builds until torch is there
#    (`--keep-going` past the crates that do, with the workspace's
#    features: built with `-p nimbus` alone, nimbus and most of its
#    dependencies were built a second time in step 2).
# 2. The whole workspace builds once, in one profile (`dev`) and one
#    feature set; both templates are members of it. With libtorch
#    in place from the start, steps 1 and 2 are one build (libtorch's C++
#    glue then compiles beside the rest instead of after it: every target
#    in 296 s, against 262 + 91 s in two builds).
# 3. Every test binary runs, the long fault-injection tests included
#    (`--include-ignored`), in two lanes at once, with the doc tests, the
#    two template crates (run from a copy outside the repository with no
#    nimbus binary to be found; nimbus is checked on its own dependencies'
#    features, as a copy of a template builds it), and the CUDA-less checks of a GPU
#    build (the one build with nimbus-train's `cuda`, on the workspace's
#    other features: a CUDA build links libtorch_cuda.so, which tests of
#    hosts without it must not need).
# 4. The tests that could not run here are counted (tests/common/not_run.rs:
#    they fail unless NIMBUS_ALLOW_NOT_RUN is set, and always under CI),
#    and the time per phase is printed and held against README.md's
#    promise (scripts/phases.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/phases.sh

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export NIMBUS_NOT_RUN_LOG="$work/not-run"
: >"$NIMBUS_NOT_RUN_LOG"

# Waits for background step $2 (pid $1), showing its output; fails as it did.
await() {
  local pid=$1 name=$2
  if ! wait "$pid"; then
    cat "$work/$name" >&2
    echo "$name failed (its output is above)" >&2
    return 1
  fi
  cat "$work/$name"
}

# Step 1.
scripts/ensure-chromium.sh >"$work/chromium" 2>&1 &
chromium=$!
scripts/check-kubernetes.sh >"$work/kubernetes" 2>&1 &
kubernetes=$!
torch_ready=
if [ -n "${LIBTORCH:-}" ]; then
  torch_ready=1
elif python=$(scripts/ensure-torch.sh --installed); then
  export LIBTORCH_USE_PYTORCH=1 PATH="$(dirname "$python"):$PATH"
  torch_ready=1
else
  scripts/ensure-torch.sh >"$work/torch.python" 2>"$work/torch" &
  torch=$!
fi
# What needs no libtorch, until torch is installed: then the build stops
# (cargo, its compilers and build scripts: a process group of their own;
# cargo keeps what it finished, only the crates under way start again)
# and step 2 builds the rest with libtorch's crates beside it, on both
# cores (waiting for this build to end first left one core idle through
# libtorch's C++ glue: 205 + 81 s against 219 s for one build). The
# crates that need libtorch fail here; any other error shows again in
# step 2.
build_until_torch() {
  setsid cargo build --workspace --all-targets --keep-going >"$work/without-torch" 2>&1 &
  local build=$!
  wait -n "$build" "$torch" || true
  if ! kill -0 "$build" 2>/dev/null; then
    wait "$build" || true
    echo "built what needs no libtorch; the rest builds once torch is installed"
    return
  fi
  kill -TERM -- -"$build"
  wait "$build" || true
  # Its compilers end on the signal too: step 2 must not start beside one.
  local waited=0
  while kill -0 -- -"$build" 2>/dev/null; do
    if [ "$waited" -ge 300 ]; then
      echo "the stopped build's processes (group $build) did not exit within 30 s" >&2
      return 1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  echo "torch installed: the build goes on with it"
}
use_torch() {
  await "$torch" torch
  local python
  python=$(cat "$work/torch.python")
  export LIBTORCH_USE_PYTORCH=1 PATH="$(dirname "$python"):$PATH"
}
if [ -z "$torch_ready" ]; then
  phase "build what needs no libtorch while torch, chromium and kubernetes-validate install" \
    build_until_torch
  phase "torch installed" use_torch
fi

# Step 2.
phase "build the workspace" cargo build --workspace --all-targets
phase "chromium and kubernetes manifests" eval 'await "$chromium" chromium && await "$kubernetes" kubernetes'

# Step 3. Two lanes at once (a test waits on processes, timeouts and
# the network much of its time: one lane alone left a third of the two
# cores idle). Lane A: the end-to-end binary, the dashboard and transfer
# benches (Chromium aborts a page load when veth links come and go,
# ERR_NETWORK_CHANGED: the dashboard's pages and the simulated hosts or
# the transfer bench's namespace must not overlap), the objects binary,
# the Tune search bench, the Data and Serve tests, the calibration bench
# and the fuzzing pass (the last five so that the lanes end together: in
# a fresh clone, lane A took 355 s and lane B 438 s without the last
# three). Lane B: every other test binary, the doc tests, the CUDA-less
# checks, then the two templates. (Lanes last as long as their longest:
# move a binary when one lane's total in the list printed at the end is
# well above the other's.) Each test binary runs from its package's
# directory, as cargo runs it (cargo itself would hold the build
# directory's lock for the whole run).
phase "build the tests" eval 'cargo test --workspace --all-targets --no-run --message-format=json-render-diagnostics >"$work/artifacts.json"'
python3 - "$work/artifacts.json" >"$work/binaries" <<'PY'
import json, os, sys
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    t = m["target"]
    package = os.path.dirname(m["manifest_path"])
    where = os.path.relpath(package) if os.path.relpath(package) != "." else "nimbus"
    print("\t".join([f"{where}:{t['kind'][0]}:{t['name']}", package, m["executable"]]))
PY
# Runs step $1 (the command after it), timed, into its lane's log.
timed() {
  local name=$1 start
  shift
  start=$(date +%s)
  echo "--- $name"
  "$@"
  echo "--- $name: $(($(date +%s) - start)) s"
}
# Runs one test binary (a line of $work/binaries).
# The end-to-end binary runs three tests at a time, not libtest's one per
# core: its tests wait on processes, timeouts and the network most of
# their time (alone, at two threads, 354 s with the cores 31 % idle; at
# three, 303 s with them 20 % idle).
run_binary() {
  local name=$1 dir=$2 exe=$3 threads=()
  if [ "$name" = nimbus:test:nimbus ]; then threads=(--test-threads 3); fi
  timed "$name" eval '(cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" --include-ignored "${threads[@]}")'
}
# The binaries of lane A.
in_lane_a() {
  case "$1" in
    nimbus:test:nimbus | nimbus:bench:dashboard | nimbus:bench:transfer | nimbus:test:objects) return 0 ;;
    nimbus:bench:tune_search | nimbus-data:test:data | nimbus-serve:test:serve) return 0 ;;
    nimbus:bench:calibration | nimbus:test:fuzz) return 0 ;;
    *) return 1 ;;
  esac
}
lane_a() {
  local name dir exe
  while IFS=$'\t' read -r name dir exe; do
    if in_lane_a "$name"; then run_binary "$name" "$dir" "$exe"; fi
  done <"$work/binaries"
}
lane_b() {
  local name dir exe
  while IFS=$'\t' read -r name dir exe; do
    if ! in_lane_a "$name"; then run_binary "$name" "$dir" "$exe"; fi
  done <"$work/binaries"
  timed "doc tests" env NIMBUS_BIN="$PWD/target/debug/nimbus" cargo test --workspace --doc
  timed "CUDA-less checks of a cuda build" \
    cargo test --workspace --features nimbus-train/cuda --test cuda
  timed "training template crate" run_alone target/debug/nimbus-template-train
  timed "template crate" run_alone target/debug/nimbus-template
  # Features resolved for the template alone: nimbus on its own
  # dependencies' features, as a copy of the template builds it.
  timed "nimbus on its own features (cargo check -p nimbus-template)" \
    cargo check -p nimbus-template
}
# A template's program, run as the README says a copy of it runs: from a
# directory of its own outside the repository, with no nimbus binary set,
# beside it or on PATH (its own binary runs its local cluster's nodes).
run_alone() {
  local program=$1 dir="$work/alone-$(basename "$1")"
  mkdir -p "$dir/tmp"
  cp "$program" "$dir/"
  # The training template keeps its results under the temporary directory:
  # here one of this run's own, removed with it.
  (cd "$dir" && env -u NIMBUS_BIN -u LD_LIBRARY_PATH PATH=/usr/local/bin:/usr/bin:/bin \
    TMPDIR="$dir/tmp" "./$(basename "$program")")
}
lanes() {
  lane_a >"$work/lane-a" 2>&1 &
  local a=$!
  lane_b >"$work/lane-b" 2>&1 &
  local b=$!
  local failed=()
  wait "$a" || failed+=("A")
  wait "$b" || failed+=("B")
  cat "$work/lane-a" "$work/lane-b"
  echo "--- test binaries and steps, seconds each:"
  grep -h '^--- .*: [0-9]* s$' "$work/lane-a" "$work/lane-b" | sed 's/^--- /    /'
  if [ ${#failed[@]} -gt 0 ]; then
    # The lanes' logs are long and CI keeps only their end: the failures
    # themselves again, last (the harness's `failed:` lines, libtest's
    # panics and summaries; an actor's panic, prefixed, is not one).
    echo "--- the failures, from the lanes' output above:" >&2
    grep -h -A4 '^failed: \|^thread .* panicked at \|^---- .* stdout ----$' \
      "$work/lane-a" "$work/lane-b" | head -n 80 >&2 || true
    echo "lane(s) ${failed[*]} failed: the first failure is above (FAILED, panicked)" >&2
    return 1
  fi
}
phase "tests in two lanes (every binary, long fault injection, doc tests, templates, CUDA-less checks)" lanes

# Step 4.
not_run=$(wc -l <"$NIMBUS_NOT_RUN_LOG")
if [ "$not_run" -gt 0 ]; then
  echo "*** $not_run test(s) did NOT run here (allowed by NIMBUS_ALLOW_NOT_RUN):"
  sed 's/^/***   /' "$NIMBUS_NOT_RUN_LOG"
else
  echo "every test ran (none did not run)"
fi
phases_report "make test" "make test "
