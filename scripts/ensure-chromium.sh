#!/usr/bin/env bash
# Makes sure Debian's `chromium` is installed for the dashboard's browser
# tests (tests/nimbus/dashboard.rs). Installs it with apt-get when missing
# and allowed (root); otherwise warns loudly, and those tests skip.
set -u
if command -v chromium >/dev/null 2>&1 || [ -n "${NIMBUS_CHROMIUM:-}" ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium for the dashboard's browser tests (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  if apt-get install -y -q chromium >/dev/null 2>&1 ||
     { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; then
    exit 0
  fi
fi
echo "*** WARNING: chromium is not installed and could not be: the dashboard's browser tests will be SKIPPED ***" >&2
exit 0
