# Timed phases for `make test` and `make demo` (sourced, not run).
#
# 1. `phase NAME COMMAND...` runs one phase, prints `==> NAME` before it
#    and its seconds after it, and records both; a failing phase fails the
#    whole run (set -e in the caller).
# 2. `phases_report TITLE PROMISE_LINE` prints where the time went and the
#    total, then compares the total with the README's promise for the
#    command: the line of README.md that starts with PROMISE_LINE says
#    "about N minutes" (or "N s"). Over the promise by more than half
#    (PROMISE_SLACK), the run fails: the promise is to be re-measured and
#    restated, or the time won back.

PHASES_STARTED=$(date +%s)
PHASE_NAMES=()
PHASE_SECONDS=()
# How far past its README promise a run may go before it fails (1.5x).
PROMISE_SLACK_PERCENT=150

phase() {
  local name=$1
  shift
  echo "==> $name" >&2
  local start
  start=$(date +%s)
  "$@"
  local took=$(($(date +%s) - start))
  PHASE_NAMES+=("$name")
  PHASE_SECONDS+=("$took")
  echo "==> $name: ${took} s" >&2
}

# The promised seconds on the README line starting with $1, from "about N
# minutes" or "about N s".
promised_seconds() {
  local line
  line=$(grep -m1 -F -- "$1" README.md || true)
  if [[ $line =~ about\ ([0-9]+)\ minutes? ]]; then
    echo $((BASH_REMATCH[1] * 60))
  elif [[ $line =~ about\ ([0-9]+)\ s ]]; then
    echo "${BASH_REMATCH[1]}"
  else
    echo "README.md has no line starting \"$1\" that says \"about N minutes\"" >&2
    return 1
  fi
}

phases_report() {
  local title=$1 promise_line=$2
  local total=$(($(date +%s) - PHASES_STARTED))
  echo "--- where $title's time went ---"
  local i
  for i in "${!PHASE_NAMES[@]}"; do
    printf '%6d s  %s\n' "${PHASE_SECONDS[$i]}" "${PHASE_NAMES[$i]}"
  done
  printf '%6d s  total (%d min %d s)\n' "$total" $((total / 60)) $((total % 60))
  local promised limit
  promised=$(promised_seconds "$promise_line")
  limit=$((promised * PROMISE_SLACK_PERCENT / 100))
  if [ "$total" -gt "$limit" ]; then
    echo "$title took ${total} s; README.md promises about ${promised} s (\"$promise_line ...\"), and more than half as much again (${limit} s) is a broken promise: win the time back, or measure again on a fresh clone and restate it" >&2
    return 1
  fi
  echo "$title: ${total} s, within README.md's about ${promised} s (fails past ${limit} s)"
}
