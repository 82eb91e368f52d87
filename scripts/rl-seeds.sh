#!/usr/bin/env bash
# The PPO CartPole figures of README.md: runs the release build of
# nimbus-rl/examples/rl_cartpole.rs once per seed (default 1 to 5) and prints each run's
# summary line, then the range of env steps, seconds and env steps/s.
# `seconds` counts from the first rollout to the end of training: the local
# cluster's start and the runners' spawn are not in it.
#
#   make build && scripts/rl-seeds.sh          # seeds 1..5
#   scripts/rl-seeds.sh 1 2 3 --learners 2     # chosen seeds, extra flags
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/examples/rl_cartpole
if [ ! -x "$bin" ]; then
  echo "rl-seeds: $bin is missing; run \`make build\` first" >&2
  exit 1
fi
seeds=()
flags=()
for arg in "$@"; do
  if [[ "$arg" =~ ^[0-9]+$ ]] && [ ${#flags[@]} -eq 0 ]; then
    seeds+=("$arg")
  else
    flags+=("$arg")
  fi
done
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3 4 5)
summaries=()
for seed in "${seeds[@]}"; do
  line=$("$bin" --seed "$seed" "${flags[@]}" | grep '^summary:' | tail -1)
  if [ -z "$line" ]; then
    echo "rl-seeds: seed $seed printed no summary line" >&2
    exit 1
  fi
  echo "seed $seed: $line"
  summaries+=("$line")
done
value() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
range() {
  printf '%s\n' "${summaries[@]}" | value "$1" | sort -g | sed -n '1p;$p' | paste -sd' '
}
echo "solved: $(printf '%s\n' "${summaries[@]}" | value solved | grep -c true) of ${#seeds[@]}"
echo "env_steps (min max): $(range env_steps)"
echo "seconds (min max): $(range seconds)"
echo "env_steps_per_s (min max): $(range env_steps_per_s)"
