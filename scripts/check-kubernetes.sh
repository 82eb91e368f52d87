#!/usr/bin/env bash
# Validates the Kubernetes manifests (deploy/kubernetes/*.yaml) against the
# Kubernetes API's schemas with kubernetes-validate (from PyPI, installed
# once into a venv in nimbus's cache, beside torch's), strictly: unknown
# fields fail too. `make test` runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.37.0
CACHE_ROOT="${NIMBUS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nimbus}"
VENV="$CACHE_ROOT/kubernetes-validate-$VERSION"

if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  echo "nimbus: installing kubernetes-validate==$VERSION into $VENV (once)" >&2
  mkdir -p "$CACHE_ROOT"
  python3 -m venv "$VENV" ||
    { echo "nimbus: python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)" >&2; exit 1; }
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$VERSION" >&2
fi
"$VENV/bin/kubernetes-validate" --strict --quiet deploy/kubernetes/*.yaml
echo "kubernetes manifests: $(ls deploy/kubernetes/*.yaml | wc -l) files valid (kubernetes-validate $VERSION, strict)"
