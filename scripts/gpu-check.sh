#!/usr/bin/env bash
# GPU checks, for a machine with an NVIDIA GPU, torch 2.11.0 (CUDA 13) and
# NCCL installed in a Python venv, and no Rust toolchain (the `device`
# machine: torch under /opt/torch/.venv). Build here, carry the binaries:
#
#   cargo build --release --workspace --features nimbus-train/cuda --bin nimbus --example train_mnist --bench train
#   cp target/release/deps/train-<hash> target/release/train-bench   # the bench binary
#   # then, on the GPU machine, from the repository root (carrying
#   # target/release/nimbus, target/release/examples/train_mnist and
#   # target/release/train-bench):
#   bash scripts/gpu-check.sh
#
# It prints the GPUs, NCCL allreduce bandwidth on device memory (1 rank; 2
# ranks sharing the GPU if NCCL allows), and the MNIST example on CUDA with
# 1 worker, then 2 workers sharing the GPU over NCCL.
set -u
VENV=${TORCH_VENV:-/opt/torch/.venv}
SITE=$(ls -d "$VENV"/lib/python3*/site-packages 2>/dev/null | head -1)
if [ -z "$SITE" ]; then
  echo "no torch venv at $VENV (set TORCH_VENV)" >&2
  exit 1
fi
LIBS="$SITE/torch/lib"
for d in "$SITE"/nvidia/*/lib; do LIBS="$LIBS:$d"; done
export LD_LIBRARY_PATH="$LIBS:${LD_LIBRARY_PATH:-}"
export NIMBUS_HOME=${NIMBUS_HOME:-$(mktemp -d)}

nvidia-smi -L || echo "nvidia-smi not available"
status=0
echo "== NCCL allreduce on device memory"
if [ -x target/release/train-bench ]; then
  PATH="$(dirname "$(command -v python3)"):$PATH" target/release/train-bench --bench nccl || status=1
else
  echo "target/release/train-bench was not carried"; status=1
fi
echo "== MNIST on CUDA, 1 worker"
target/release/examples/train_mnist --use-gpu --workers 1 --epochs 1 --nodes 1 || status=1
echo "== MNIST on CUDA, 2 workers sharing the GPU (NCCL)"
target/release/examples/train_mnist --use-gpu --workers 2 --gpus-per-worker 0.5 --epochs 1 --nodes 1 || status=1
exit $status
