# Quick start: `make demo`, `make test`. See README.md.
#
# Every target first makes sure libtorch is available: with LIBTORCH set, that
# libtorch is used; otherwise torch==2.11.0 is installed once from PyPI into a
# cache outside the repository (scripts/ensure-torch.sh) and tch builds
# against it (LIBTORCH_USE_PYTORCH=1).

EXAMPLE ?= local_cluster
ARGS ?=

TORCH_ENV = if [ -z "$$LIBTORCH" ]; then \
	  PY=$$(scripts/ensure-torch.sh) || exit 1; \
	  export LIBTORCH_USE_PYTORCH=1 PATH="$$(dirname $$PY):$$PATH"; \
	fi

.PHONY: demo test test-long fuzz build run lint bench image gpu-bundle

# Builds only what it runs, in make test's profile, in timed phases held
# against README.md's promise (scripts/demo.sh).
demo:
	@scripts/demo.sh

# Every test, in timed phases, held against README.md's promise
# (scripts/test.sh says what runs when).
test:
	@scripts/test.sh

# The long fault-injection tests alone (about 75 s here; `make test` runs
# them too, after the others).
test-long:
	@$(TORCH_ENV); cargo build --workspace --bins --examples && cargo test --test nimbus -- --ignored

# The long fuzzing run: a million inputs per decoder (`make test` runs a
# short pass). A panic leaves its input in target/fuzz-crashers/.
fuzz:
	@$(TORCH_ENV); NIMBUS_FUZZ_INPUTS=$${NIMBUS_FUZZ_INPUTS:-1000000} \
	  NIMBUS_FUZZ_SEED=$${NIMBUS_FUZZ_SEED:-$$(date +%s)} cargo test --release --workspace --test fuzz

build:
	@$(TORCH_ENV); cargo build --release --workspace --bins --examples

run:
	@$(TORCH_ENV); cargo build --release --workspace --bins --examples && target/release/examples/$(EXAMPLE) $(ARGS)

bench:
	@$(TORCH_ENV); cargo bench --bench calibration && cargo bench --bench rpc && cargo bench --bench tune_search && cargo bench -p nimbus-train --bench train && \
	  cargo build --release --workspace --bins --examples && cargo bench --bench dashboard

lint:
	@$(TORCH_ENV); cargo fmt --all --check && \
	  cargo clippy --workspace --all-targets -- -D warnings && \
	  cargo clippy --workspace --all-targets --features nimbus-train/cuda -- -D warnings && \
	  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

# What a GPU machine without Rust runs: target/gpu-bundle/ (stripped
# binaries built with the `cuda` feature, the peers, gpu-check.sh); there:
# `bash target/gpu-bundle/gpu-check.sh`.
gpu-bundle:
	@$(TORCH_ENV); scripts/gpu-bundle.sh

# The container image (Dockerfile): where Docker exists. Its runtime steps
# are scripts/image-runtime.sh, which the tests run without Docker.
image:
	@docker info >/dev/null 2>&1 || { echo "make image needs docker with a running daemon (docker info fails); the image's runtime layout alone: make build && scripts/image-runtime.sh DIR" >&2; exit 1; }
	docker build -t nimbus .
