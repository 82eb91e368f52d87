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

# The standalone crate template (examples/template, nimbus by path), built
# into this target directory so it shares the compiled dependencies.
TEMPLATE = --manifest-path examples/template/Cargo.toml

.PHONY: demo test test-long fuzz build run lint bench

demo:
	@$(TORCH_ENV); cargo build --release --bins --examples && target/release/examples/local_cluster && \
	  target/release/examples/train_mnist --workers 2 --epochs 2 --fail-at-step 60

test:
	@scripts/ensure-chromium.sh
	@$(TORCH_ENV); cargo build --no-default-features --all-targets && \
	  cargo test --no-default-features --lib && \
	  cargo build --bins --examples && \
	  cargo test --all-targets && \
	  cargo test --test nimbus -- --ignored && \
	  NIMBUS_BIN=$$(pwd)/target/debug/nimbus cargo test --doc && \
	  cargo build $(TEMPLATE) --target-dir target && \
	  PATH=$$(pwd)/target/debug:$$PATH target/debug/nimbus-template

# The long fault-injection tests alone (about 75 s here; `make test` runs
# them too, after the others).
test-long:
	@$(TORCH_ENV); cargo build --bins --examples && cargo test --test nimbus -- --ignored

# The long fuzzing run: a million inputs per decoder (`make test` runs a
# short pass). A panic leaves its input in target/fuzz-crashers/.
fuzz:
	@$(TORCH_ENV); NIMBUS_FUZZ_INPUTS=$${NIMBUS_FUZZ_INPUTS:-1000000} \
	  NIMBUS_FUZZ_SEED=$${NIMBUS_FUZZ_SEED:-$$(date +%s)} cargo test --release --test fuzz

build:
	@$(TORCH_ENV); cargo build --release --bins --examples

run:
	@$(TORCH_ENV); cargo build --release --bins --examples && target/release/examples/$(EXAMPLE) $(ARGS)

bench:
	@$(TORCH_ENV); cargo bench --bench calibration && cargo bench --bench rpc && cargo bench --bench train && \
	  cargo build --release --bins --examples && cargo bench --bench dashboard

lint:
	@$(TORCH_ENV); cargo fmt --check && \
	  cargo clippy --all-targets -- -D warnings && \
	  cargo clippy --all-targets --no-default-features -- -D warnings && \
	  cargo clippy --all-targets --features cuda -- -D warnings && \
	  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps && \
	  cargo fmt $(TEMPLATE) --check && cargo clippy $(TEMPLATE) --target-dir target -- -D warnings
