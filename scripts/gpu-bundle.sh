#!/usr/bin/env bash
# Builds what the GPU check runs (`make gpu-bundle`): release binaries
# with the `cuda` feature, stripped, and the scripts, in
# target/gpu-bundle/ (at most 64 MiB, the most the device machine takes):
#   bin/nimbus        the CLI and node daemon (no feature needed: every
#                     build counts GPUs through the CUDA driver)
#   bin/train_mnist   the MNIST example
#   bin/train-bench   nimbus-train's `train` benchmark
#   peers/            its PyTorch peers (torch.distributed NCCL, the GPT)
#   gpu-check.sh      the check (scripts/gpu-check.sh)
# The binaries load libtorch and NCCL of the machine's torch venv at run
# time (gpu-check.sh sets LD_LIBRARY_PATH). An earlier bundle is replaced;
# a target/gpu-bundle that this script did not make is left alone.
set -euo pipefail

out=target/gpu-bundle
marker=.nimbus-gpu-bundle
limit=$((64 << 20))

if [ -e "$out" ]; then
  if [ ! -e "$out/$marker" ]; then
    echo "gpu-bundle: $out exists and is not a bundle this script made; move it away" >&2
    exit 1
  fi
  rm -rf "$out"
fi
cargo build --release -p nimbus --bin nimbus
cargo build --release -p nimbus-train --features cuda --example train_mnist
bench=$(cargo bench -p nimbus-train --features cuda --bench train --no-run --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "train" and m.get("executable"):
        print(m["executable"])')
[ -x "$bench" ] || { echo "gpu-bundle: no train bench binary built" >&2; exit 1; }

mkdir -p "$out/bin" "$out/peers"
touch "$out/$marker"
cp target/release/nimbus target/release/examples/train_mnist "$out/bin/"
cp "$bench" "$out/bin/train-bench"
strip "$out"/bin/*
cp nimbus-train/benches/peers/nccl_allreduce.py nimbus-train/benches/peers/gpt_eager.py "$out/peers/"
cp scripts/gpu-check.sh "$out/"
for program in "$out"/bin/*; do
  if ! readelf -d "$program" | grep -q '\[libtorch_cuda.so\]' && [ "$(basename "$program")" != nimbus ]; then
    echo "gpu-bundle: $program does not need libtorch_cuda.so: libtorch would see no GPU (is the libtorch a CUDA build?)" >&2
    exit 1
  fi
done
bytes=$(du -sb "$out" | cut -f1)
echo "gpu_bundle_size: $((bytes >> 20)) MiB ($bytes bytes) in $out"
if [ "$bytes" -gt "$limit" ]; then
  echo "gpu-bundle: $bytes bytes is over the device machine's 64 MiB" >&2
  exit 1
fi
