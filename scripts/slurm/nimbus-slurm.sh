#!/usr/bin/env bash
# A nimbus cluster inside a Slurm allocation: the logic of nimbus.sbatch,
# which runs `node` on every node of the job (srun, one task per node) and
# `run` on the first. Also run by tests/nimbus/hosts.rs with the SLURM_*
# variables set for simulated hosts.
#
#   nimbus-slurm.sh node          # on every node: the head on node 0, members elsewhere
#   nimbus-slurm.sh run CMD...    # once: wait for the cluster, run CMD on it
#
# Reads SLURM_JOB_NODELIST (hosts; expanded with `scontrol show hostnames`
# where it exists, else a comma-separated list), SLURM_NODEID (this
# node's index in it) and SLURM_JOB_NUM_NODES. Settings:
#   NIMBUS_SLURM_DIR   a directory every node shares (default
#                      $SLURM_SUBMIT_DIR): node 0 makes the job's own
#                      .nimbus-slurm-$SLURM_JOB_ID in it (mode 0700), where
#                      the head leaves its token and output
#   NIMBUS_PORT        the head's UDP port (default 6379)
#   NIMBUS_SLURM_WAIT  seconds to wait for the head and the members (default 120)
#   NIMBUS             the nimbus binary (default: nimbus on PATH)
#   NIMBUS_START_ARGS  more flags for every `nimbus start` (e.g. --num-gpus 8)
#
# Each node keeps its state (NIMBUS_HOME: binary cache, logs, spill) on
# its own disk, $TMPDIR/nimbus-slurm-$SLURM_JOB_ID-N, never on the shared
# filesystem, where nodes and jobs would mix theirs.
#
# Steps (node):
#   1. Find the head host (the first of the node list) and this node's.
#   2. Node 0: make the job's directory (it must not exist), then
#      `nimbus start --head --block` in the foreground of this step,
#      binding this host's address; once it is up, copy its token into
#      the job's directory. A head that exits first fails the step with
#      its output.
#   3. Other nodes: wait for the token (at most NIMBUS_SLURM_WAIT), then
#      `nimbus start --address HEAD:PORT --block` as `slurm-N`.
#   4. SIGTERM (Slurm ending the step, or nimbus.sbatch's trap) stops the
#      node and its workers. Node 0, once its head has stopped (or failed
#      to start), removes what it made: the token, the head's output
#      (which prints the token too) and the job's directory.
# Steps (run):
#   1. Wait for the token and for SLURM_JOB_NUM_NODES nodes alive.
#   2. Run CMD with NIMBUS_ADDRESS and NIMBUS_TOKEN set (nimbus::init
#      joins that cluster); exit with its status.
set -euo pipefail

nimbus="${NIMBUS:-nimbus}"
port="${NIMBUS_PORT:-6379}"
wait_s="${NIMBUS_SLURM_WAIT:-120}"
job="${SLURM_JOB_ID:?SLURM_JOB_ID is not set: not in a Slurm job?}"
dir="${NIMBUS_SLURM_DIR:-${SLURM_SUBMIT_DIR:?SLURM_SUBMIT_DIR is not set: not in a Slurm job? Set NIMBUS_SLURM_DIR}}/.nimbus-slurm-$job"
token="$dir/token"

fail() {
  echo "nimbus-slurm: $*" >&2
  exit 1
}

hosts() {
  local list="${SLURM_JOB_NODELIST:?SLURM_JOB_NODELIST is not set: not in a Slurm job?}"
  if command -v scontrol >/dev/null 2>&1; then
    scontrol show hostnames "$list"
  else
    tr ',' '\n' <<<"$list"
  fi
}

# An IPv4 address of host $1 (itself if it is one).
address_of() {
  if [[ "$1" =~ ^[0-9]+(\.[0-9]+){3}$ ]]; then
    echo "$1"
  else
    getent ahostsv4 "$1" | awk 'NR == 1 { print $1 }'
  fi
}

head_host=$(hosts | head -n 1)
[ -n "$head_host" ] || fail "SLURM_JOB_NODELIST names no host"
head_address="$(address_of "$head_host"):$port"

# Waits until "$@" succeeds, at most wait_s seconds; says what it waited for ($1).
wait_for() {
  local what="$1" deadline=$((SECONDS + wait_s))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail "$what not within ${wait_s} s (NIMBUS_SLURM_WAIT)"
    sleep 0.5
  done
}

alive_nodes() {
  "$nimbus" status --json --address "$head_address" --token-file "$token" |
    grep -c '"state": "alive"'
}

all_alive() {
  [ "$(alive_nodes)" -ge "${SLURM_JOB_NUM_NODES:?}" ]
}

case "${1:-}" in
  node)
    index="${SLURM_NODEID:?SLURM_NODEID is not set: run this with srun}"
    export NIMBUS_HOME="${TMPDIR:-/tmp}/nimbus-slurm-$job-$index"
    me=$(hosts | sed -n "$((index + 1))p")
    [ -n "$me" ] || fail "SLURM_NODEID $index is beyond SLURM_JOB_NODELIST"
    ip=$(address_of "$me")
    # shellcheck disable=SC2086 # NIMBUS_START_ARGS is a list of flags
    if [ "$index" = 0 ]; then
      umask 077
      mkdir "$dir" || fail "cannot make the job's directory $dir (it must not exist yet)"
      out="$dir/head.out"
      "$nimbus" start --head --block --port "$port" --node-ip-address "$ip" \
        ${NIMBUS_START_ARGS:-} >"$out" 2>&1 &
      head_pid=$!
      # Step 4's removal.
      clean_up() {
        rm -f "$token" "$token.part" "$out"
        rmdir "$dir" 2>/dev/null || true
      }
      trap 'kill -TERM $head_pid 2>/dev/null' TERM INT
      trap 'kill -TERM $head_pid 2>/dev/null; wait $head_pid 2>/dev/null; clean_up' EXIT
      deadline=$((SECONDS + wait_s))
      until grep -q '^token-file: ' "$out"; do
        kill -0 $head_pid 2>/dev/null || fail "the head exited before it was up: $(tail -n 5 "$out")"
        [ $SECONDS -lt $deadline ] || fail "the head was not up within ${wait_s} s (NIMBUS_SLURM_WAIT): $(tail -n 5 "$out")"
        sleep 0.5
      done
      cp "$(sed -n 's/^token-file: //p' "$out")" "$token.part"
      mv "$token.part" "$token"
      echo "nimbus-slurm: head up at $head_address"
      status=0
      wait $head_pid || status=$?
      # A TERM ends the first wait early: wait for the head to have stopped.
      if kill -0 $head_pid 2>/dev/null; then
        status=0
        wait $head_pid || status=$?
      fi
      trap - EXIT
      clean_up
      exit $status
    else
      wait_for "the head's token in $token" test -s "$token"
      exec "$nimbus" start --block --address "$head_address" --token-file "$token" \
        --node-ip-address "$ip" --node-name "slurm-$index" ${NIMBUS_START_ARGS:-}
    fi
    ;;
  run)
    shift
    export NIMBUS_HOME="${TMPDIR:-/tmp}/nimbus-slurm-$job-driver"
    [ $# -gt 0 ] || fail "usage: nimbus-slurm.sh run CMD..."
    wait_for "the head's token in $token" test -s "$token"
    wait_for "${SLURM_JOB_NUM_NODES:-?} nodes alive" all_alive
    NIMBUS_ADDRESS="$head_address" NIMBUS_TOKEN="$(cat "$token")" "$@"
    ;;
  *)
    fail "usage: nimbus-slurm.sh node | run CMD..."
    ;;
esac
