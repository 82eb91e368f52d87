#!/usr/bin/env bash
# The GPU check: one command for a machine with an NVIDIA GPU and torch
# 2.11.0 (CUDA 13, its NCCL) in a Python venv, and no Rust toolchain.
#
#   make gpu-bundle                       # here: target/gpu-bundle/, < 64 MiB
#   # carry target/gpu-bundle to the GPU machine, then there:
#   bash target/gpu-bundle/gpu-check.sh   # TORCH_VENV=... if not /opt/torch/.venv
#
# Each step runs under `timeout` (STEP_TIMEOUT, 120 s), and all of them
# within TOTAL_SECONDS (470 s): under 8 minutes on any machine; about 4
# expected on one H200. It prints `name: value unit` lines, one `summary:` line,
# and exits non-zero when a correctness check fails:
#   1. facts: GPU, driver, CUDA, torch, NCCL; that libtorch_cuda resolves;
#   2. NCCL allreduce latency, 1 rank: nimbus against torch.distributed
#      (4 KiB to 256 MiB); 2 ranks on the one GPU through per-rank
#      NCCL_HOSTID (a functional check), averaging 1 and 2 to exactly 1.5;
#   3. 1 GPU worker against a plain tch loop on the same GPU (framework
#      overhead): the MNIST CNN (samples/s) and a small GPT in bf16
#      (tokens/s, also against a plain PyTorch eager loop);
#   4. 2 workers sharing the GPU over the shared-memory collective,
#      replicas bit-identical after every step;
#   5. 2 NCCL ranks on the GPU (per-rank NCCL_HOSTID), replicas
#      bit-identical after every step;
#   6. the hang watchdog: a rank SIGKILLs itself while its peer is in the
#      allreduce; the communicator is aborted and the group restarted from
#      the checkpoint within 10 s;
#   7. MNIST test accuracy on the GPU within 0.02 of the CPU run's (same
#      seed), in f32 and under autocast (f16, tch's default on CUDA),
#      after 1 epoch (after 2, both reach 1.0 on the generated digits and
#      the comparison checks nothing).
set -u

HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=$HERE
[ -x "$BUNDLE/bin/nimbus" ] || BUNDLE=$HERE/../target/gpu-bundle
VENV=${TORCH_VENV:-/opt/torch/.venv}
# Each step's limit, and the whole check's.
STEP_TIMEOUT=${STEP_TIMEOUT:-120}
TOTAL_SECONDS=${TOTAL_SECONDS:-470}

fail() { echo "gpu-check: $*" >&2; exit 2; }
[ -x "$BUNDLE/bin/nimbus" ] || fail "no bundle at $HERE or $HERE/../target/gpu-bundle (make gpu-bundle)"
[ -x "$VENV/bin/python" ] || fail "no Python venv at $VENV (set TORCH_VENV)"
SITE=$(ls -d "$VENV"/lib/python3*/site-packages 2>/dev/null | head -1)
[ -d "$SITE/torch/lib" ] || fail "no torch in $VENV ($SITE/torch/lib is missing)"

LIBS="$SITE/torch/lib"
for d in "$SITE"/nvidia/*/lib; do
  [ -d "$d" ] && LIBS="$LIBS:$d"
done
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"
export PATH="$BUNDLE/bin:$VENV/bin:$PATH"
export NIMBUS_PYTHON="$VENV/bin/python"
export NIMBUS_BENCH_PEERS="$BUNDLE/peers"
# Everything the check writes (runs, nimbus state, a failed program's
# kept cluster logs) goes under one directory: removed when every check
# passes, kept (and named) when one fails.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/nimbus-gpu-check-XXXXXX")
mkdir -p "$WORK/tmp"
export NIMBUS_HOME="$WORK/home" TMPDIR="$WORK/tmp" RUST_LIB_BACKTRACE=0
RUNS="$WORK/runs"

passed=0
failed=0
failures=""
check() { # check NAME OK(0|1) DETAIL
  if [ "$2" = 1 ]; then
    passed=$((passed + 1))
    echo "check_$1: pass"
  else
    failed=$((failed + 1))
    failures="$failures $1"
    echo "check_$1: FAIL ($3)"
  fi
}
# run NAME SECONDS COMMAND...: runs it under timeout (SECONDS, or less
# to stay within the whole check's TOTAL_SECONDS), its output to
# $WORK/NAME.log and to stdout; its status in $rc (124: timed out).
run() {
  local name=$1 seconds=$2 left
  shift 2
  left=$(( start + TOTAL_SECONDS - $(date +%s) ))
  [ "$left" -lt "$seconds" ] && seconds=$left
  echo "== $name: $*"
  if [ "$seconds" -le 0 ]; then
    echo "($name skipped: the check's $TOTAL_SECONDS s are spent)"
    rc=124
    return
  fi
  timeout --kill-after=10 "$seconds" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  cat "$WORK/$name.log"
  [ $rc = 124 ] && echo "($name timed out after $seconds s)"
}
# field FILE KEY: the value of KEY= on FILE's summary line.
field() { grep -a '^summary:' "$1" | tail -1 | tr ' ' '\n' | sed -n "s/^$2=//p"; }

start=$(date +%s)

# 1. Facts.
echo "== facts"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1 | sed 's/^/fact_gpu: /'
"$NIMBUS_PYTHON" - <<'EOF' 2>&1
import torch
print(f"fact_torch: {torch.__version__}")
print(f"fact_cuda: {torch.version.cuda}")
print(f"fact_torch_nccl: {'.'.join(map(str, torch.cuda.nccl.version()))}")
print(f"fact_torch_sees_gpus: {torch.cuda.device_count()} devices")
EOF
gpus=$("$NIMBUS_PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null)
if [ "${gpus:-0}" = 0 ]; then
  echo "summary: passed=0 failed=1 seconds=$(( $(date +%s) - start )) failures=gpu_visible"
  echo "gpu-check: torch sees no GPU here (torch.cuda.device_count() is ${gpus:-not readable}); nothing to check" >&2
  rm -rf "$WORK"
  exit 1
fi
if nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | grep -q Exclusive; then
  echo "summary: passed=0 failed=1 seconds=$(( $(date +%s) - start )) failures=gpu_shared"
  echo "gpu-check: the GPU is in an exclusive compute mode; the checks run several processes on it (nvidia-smi -c DEFAULT)" >&2
  rm -rf "$WORK"
  exit 1
fi
missing=$(ldd "$BUNDLE/bin/train_mnist" | grep -E 'libtorch_cuda|not found')
echo "$missing" | sed 's/^/fact_ldd: /'
echo "$missing" | grep -q 'libtorch_cuda.so => /' && ! echo "$missing" | grep -q 'not found'
check libtorch_cuda_resolves $(( $? == 0 )) "ldd bin/train_mnist: $missing"

# 2. NCCL: 1 rank against torch.distributed; 2 ranks, exact average.
run nccl 150 train-bench --bench nccl
check nccl_runs_and_averages_exactly $(( rc == 0 )) "see the nccl step's output, exit $rc"

# 3. Throughput, 1 GPU worker against plain loops.
run throughput 240 train-bench --bench gpu gpt
check throughput_runs $(( rc == 0 )) "see the throughput step's output, exit $rc"

MNIST=(train_mnist --nodes 1 --epochs 1 --storage "$RUNS")
SHARED=(--use-gpu --workers 2 --gpus-per-worker 0.5)

# 4. 2 workers sharing the GPU, shared-memory collective.
run shared_memory "$STEP_TIMEOUT" "${MNIST[@]}" "${SHARED[@]}" --collective shared-memory --check-replicas
check shared_memory_replicas_identical $(( rc == 0 )) "exit $rc"

# 5. 2 NCCL ranks on the GPU.
run nccl_ranks "$STEP_TIMEOUT" "${MNIST[@]}" "${SHARED[@]}" --collective nccl --nccl-hostid-per-rank --check-replicas
check nccl_replicas_identical $(( rc == 0 )) "exit $rc"

# 6. The watchdog: the last rank dies before step 30 (of 47); the first is then
# in step 30's allreduce, waiting for it.
run watchdog "$STEP_TIMEOUT" "${MNIST[@]}" "${SHARED[@]}" --collective nccl --nccl-hostid-per-rank \
  --checkpoint-every 10 --fail-at-step 30
recovery=$(grep -a '^recovery:' "$WORK/watchdog.log" | head -1 | awk '{print $2}')
restarts=$(field "$WORK/watchdog.log" restarts)
echo "watchdog_death_to_first_step: ${recovery:-none} s"
ok=$(awk -v r="${recovery:-99}" -v n="${restarts:-0}" -v rc=$rc 'BEGIN { print (rc == 0 && n == 1 && r < 10) ? 1 : 0 }')
check watchdog_restart_under_10s "$ok" "exit $rc, restarts ${restarts:-none}, recovery ${recovery:-none} s"

# 7. Accuracy, GPU against CPU, same seed.
run accuracy_gpu "$STEP_TIMEOUT" train_mnist --nodes 1 --epochs 1 --storage "$RUNS" --workers 1 --use-gpu --seed 0
gpu_accuracy=$(field "$WORK/accuracy_gpu.log" test_accuracy)
run accuracy_cpu "$STEP_TIMEOUT" train_mnist --nodes 1 --epochs 1 --storage "$RUNS" --workers 1 --seed 0
cpu_accuracy=$(field "$WORK/accuracy_cpu.log" test_accuracy)
echo "mnist_accuracy_gpu: ${gpu_accuracy:-none} fraction"
echo "mnist_accuracy_cpu: ${cpu_accuracy:-none} fraction"
# near A B: 1 when both are accuracies above 0.5 within 0.02 of each other.
near() { awk -v g="${1:-nan}" -v c="${2:-nan}" 'BEGIN { d = g - c; if (d < 0) d = -d; print (g + 0 > 0.5 && c + 0 > 0.5 && d <= 0.02) ? 1 : 0 }'; }
check gpu_accuracy_matches_cpu "$(near "$gpu_accuracy" "$cpu_accuracy")" "GPU ${gpu_accuracy:-none}, CPU ${cpu_accuracy:-none}"
run accuracy_autocast "$STEP_TIMEOUT" train_mnist --nodes 1 --epochs 1 --storage "$RUNS" --workers 1 --use-gpu --autocast --seed 0
autocast_accuracy=$(field "$WORK/accuracy_autocast.log" test_accuracy)
echo "mnist_accuracy_gpu_autocast: ${autocast_accuracy:-none} fraction"
check gpu_autocast_accuracy_matches_cpu "$(near "$autocast_accuracy" "$cpu_accuracy")" "GPU autocast ${autocast_accuracy:-none}, CPU ${cpu_accuracy:-none}"

seconds=$(( $(date +%s) - start ))
echo "gpu_check_wall: $seconds s"
echo "summary: passed=$passed failed=$failed seconds=$seconds failures=${failures# }"
if [ "$failed" = 0 ]; then
  rm -rf "$WORK"
else
  echo "gpu-check: logs, runs and kept cluster files are in $WORK" >&2
  exit 1
fi
