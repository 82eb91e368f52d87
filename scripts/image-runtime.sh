#!/usr/bin/env bash
# Lays out nimbus's runtime under PREFIX: the container image's steps
# (Dockerfile, `make image`), runnable outside Docker too, so that CI tests
# them (tests/nimbus/hosts.rs runs a layout on a host without the build's
# libtorch).
#
#   scripts/image-runtime.sh PREFIX [BUILD_DIR]
#
# BUILD_DIR is where the programs were built (default target/release).
#   1. PREFIX/bin: the `nimbus` CLI and node daemon, and the example
#      programs (the training ones too).
#   2. PREFIX/lib: every shared library those programs load from outside
#      the system's directories (libtorch and what it needs, from the
#      torch install they were built against), and NCCL from the same
#      torch release when it has one (loaded at run time by GPU training);
#      PREFIX/version.py (or build-version): that libtorch's release and
#      CUDA build, as its distribution states them beside its lib/
#      (nimbus's cluster/versions.rs reads them).
#   3. Checks: with LD_LIBRARY_PATH=PREFIX/lib, every program finds each
#      of its libraries, in PREFIX/lib or the system's directories, and
#      nowhere else. The programs keep an rpath to the build's libtorch;
#      LD_LIBRARY_PATH comes first, and where the build's is absent the
#      rpath finds nothing.
# PREFIX must not exist yet, or be empty: the script never deletes.
set -euo pipefail

prefix="${1:?usage: scripts/image-runtime.sh PREFIX [BUILD_DIR]}"
build="${2:-target/release}"
programs=(nimbus examples/train_mnist examples/rl_cartpole examples/custom_actor examples/tasks examples/local_cluster)

if [ -e "$prefix" ] && [ -n "$(ls -A "$prefix")" ]; then
  echo "image-runtime: $prefix is not empty; give a new directory" >&2
  exit 1
fi
for program in "${programs[@]}"; do
  if [ ! -x "$build/$program" ]; then
    echo "image-runtime: $build/$program is not built (make build)" >&2
    exit 1
  fi
done
mkdir -p "$prefix/bin" "$prefix/lib"
prefix="$(cd "$prefix" && pwd)"

# Libraries in these directories come with the system (the runtime image's
# Debian has them too); everything else is copied.
system_library() {
  case "$1" in
    /lib/* | /lib64/* | /usr/lib/* | /usr/lib64/*) return 0 ;;
    *) return 1 ;;
  esac
}

# 1 and 2.
for program in "${programs[@]}"; do
  cp "$build/$program" "$prefix/bin/"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      echo "image-runtime: $build/$program cannot load $name here" >&2
      exit 1
    fi
    if ! system_library "$path" && [ ! -e "$prefix/lib/$name" ]; then
      cp -L "$path" "$prefix/lib/$name"
    fi
  done < <(ldd "$build/$program")
done
torch_lib=$(ldd "$build/examples/train_mnist" | awk '$1 == "libtorch_cpu.so" { print $3 }')
nccl=$(dirname "$torch_lib")/../../nvidia/nccl/lib/libnccl.so.2
if [ -e "$nccl" ]; then
  cp -L "$nccl" "$prefix/lib/"
else
  echo "image-runtime: no NCCL beside $torch_lib (GPU collectives will need one: NIMBUS_NCCL_LIB)" >&2
fi
# The libtorch's release and CUDA build, as its distribution states them
# beside lib/ (a torch package's version.py, a libtorch archive's
# build-version), for the release check between a driver and its workers.
torch_dir=$(dirname "$torch_lib")/..
if [ -e "$torch_dir/version.py" ]; then
  cp "$torch_dir/version.py" "$prefix/version.py"
elif [ -e "$torch_dir/build-version" ]; then
  cp "$torch_dir/build-version" "$prefix/build-version"
else
  echo "image-runtime: $torch_dir states no release (version.py or build-version); workers will not check theirs" >&2
fi

# 3.
status=0
for program in "$prefix"/bin/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in
      not) echo "image-runtime: $program: $name not found" >&2; status=1 ;;
      "$prefix"/lib/*) ;;
      *) system_library "$path" || { echo "image-runtime: $program loads $path from outside $prefix" >&2; status=1; } ;;
    esac
  done < <(LD_LIBRARY_PATH="$prefix/lib" ldd "$program")
done
[ $status = 0 ] || exit 1
echo "image-runtime: $prefix: $(ls "$prefix/bin" | wc -l) programs, $(ls "$prefix/lib" | wc -l) libraries ($(du -sh "$prefix/lib" | cut -f1)); run with LD_LIBRARY_PATH=$prefix/lib"
