#!/usr/bin/env bash
# Makes sure a Python venv with torch==$TORCH_VERSION exists in a cache directory
# outside the repository, and prints the path of its python interpreter.
#
# The venv is reused on later runs and re-created when the installed version
# differs. Set LIBTORCH to use an existing libtorch instead (then this script is
# not needed; see README.md). With `--installed`, it installs nothing: it
# prints the interpreter's path if the venv is in place, else fails.
set -euo pipefail

TORCH_VERSION="${TORCH_VERSION:-2.11.0}"
CACHE_ROOT="${NIMBUS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nimbus}"
VENV="$CACHE_ROOT/torch-$TORCH_VERSION"
PY="$VENV/bin/python"

# About what the venv takes once installed (4.7 GB) and pip's download and
# unpacking on top of it, in MiB.
NEEDED_MIB=$((7 * 1024))

# Says everything the first install needs that this machine lacks, at once,
# before starting it (not deep inside pip or torch-sys's build script).
preflight() {
  local missing=()
  if ! command -v python3 >/dev/null 2>&1; then
    missing+=("Python 3 (python3): Debian/Ubuntu: apt-get install python3 python3-venv")
  elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=("Python's venv with pip (python3 -m venv): Debian/Ubuntu: apt-get install python3-venv")
  fi
  if ! command -v "${CXX:-c++}" >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 &&
     ! command -v clang++ >/dev/null 2>&1; then
    missing+=("a C++ compiler (torch-sys compiles its C++ glue; set CXX or install one): Debian/Ubuntu: apt-get install g++")
  fi
  local dir="$CACHE_ROOT"
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  local free_mib
  free_mib=$(df -Pm "$dir" | awk 'NR == 2 { print $4 }')
  if [ -n "$free_mib" ] && [ "$free_mib" -lt "$NEEDED_MIB" ]; then
    missing+=("disk: torch==$TORCH_VERSION needs about $NEEDED_MIB MiB under $CACHE_ROOT, and $dir has $free_mib MiB free (set NIMBUS_CACHE_DIR to a larger disk, or LIBTORCH to an existing libtorch)")
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    echo "nimbus: the first build installs torch==$TORCH_VERSION (for libtorch) into $VENV, and this machine lacks:" >&2
    local item
    for item in "${missing[@]}"; do echo "  - $item" >&2; done
    exit 1
  fi
}

installed_version() {
  "$PY" -c 'import torch, sys; sys.stdout.write(torch.__version__.split("+")[0])' 2>/dev/null || true
}

if [ "${1:-}" = --installed ]; then
  [ "$(installed_version)" = "$TORCH_VERSION" ] || exit 1
  echo "$PY"
  exit 0
fi

if [ "$(installed_version)" != "$TORCH_VERSION" ]; then
  preflight
  echo "nimbus: installing torch==$TORCH_VERSION into $VENV (once; reused later)" >&2
  rm -rf "$VENV"
  mkdir -p "$CACHE_ROOT"
  python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  "$PY" -m pip install --quiet --disable-pip-version-check "torch==$TORCH_VERSION" >&2
  if [ "$(installed_version)" != "$TORCH_VERSION" ]; then
    echo "nimbus: torch==$TORCH_VERSION did not install into $VENV" >&2
    exit 1
  fi
fi
echo "$PY"
