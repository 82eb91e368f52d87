#!/usr/bin/env bash
# Makes sure a Python venv with torch==$TORCH_VERSION exists in a cache directory
# outside the repository, and prints the path of its python interpreter.
#
# The venv is reused on later runs and re-created when the installed version
# differs. Set LIBTORCH to use an existing libtorch instead (then this script is
# not needed; see README.md).
set -euo pipefail

TORCH_VERSION="${TORCH_VERSION:-2.11.0}"
CACHE_ROOT="${NIMBUS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nimbus}"
VENV="$CACHE_ROOT/torch-$TORCH_VERSION"
PY="$VENV/bin/python"

installed_version() {
  "$PY" -c 'import torch, sys; sys.stdout.write(torch.__version__.split("+")[0])' 2>/dev/null || true
}

if [ "$(installed_version)" != "$TORCH_VERSION" ]; then
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
