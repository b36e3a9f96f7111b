#!/usr/bin/env bash
# Side-by-side measurements on this machine, one after another (never in CI):
# the raw env ceiling, impactrl's training throughput and time to CartPole 450, and the same
# for RLlib's APPO and IMPALA (installed here into a venv of its own: RLlib pins gymnasium 1.2.2).
#   bash benchmarks/run.sh [SECONDS]      results in benchmarks/results/, table: benchmarks/summarize.py
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-90}
OUT=benchmarks/results
mkdir -p "$OUT"
PY=${PYTHON:-python}

if [ ! -x benchmarks/.venv-rllib/bin/python ]; then
  python3 -m venv benchmarks/.venv-rllib
  benchmarks/.venv-rllib/bin/pip install -q torch==2.13.0
  benchmarks/.venv-rllib/bin/pip install -q "ray[rllib]==2.60.0" ale-py minatar opencv-python-headless
  benchmarks/.venv-rllib/bin/pip install -q --no-deps -e .
fi
RLLIB=benchmarks/.venv-rllib/bin/python

$PY benchmarks/env_ceiling.py --seconds 10 > "$OUT/env_ceiling.jsonl"

: > "$OUT/throughput.jsonl"
for env in CartPole-v1 MinAtar/Breakout-v1 ALE/Pong-v5; do
  $PY -m impactrl bench --algo impala --env "$env" --num-actors 2 --seconds "$SECONDS_EACH" | tail -1 \
    | sed 's/^{/{"system": "impactrl-impala", /' >> "$OUT/throughput.jsonl"
  for algo in APPO IMPALA; do
    $RLLIB benchmarks/rllib_baseline.py --algo $algo --env "$env" --env-runners 2 --seconds "$SECONDS_EACH" \
      | tail -1 >> "$OUT/throughput.jsonl"
  done
done

: > "$OUT/cartpole_time_to_450.jsonl"
for seed in 1 2 3; do
  for algo in impala impact; do
    run=$(mktemp -d)/run
    start=$(date +%s.%N)
    $PY -m impactrl train --algo $algo --env CartPole-v1 --num-actors 2 --seed $seed --out "$run" --log-interval-s 1 > /dev/null
    $PY benchmarks/time_to_return.py "$run" 450 --system "impactrl-$algo" --seed $seed --started "$start" \
      >> "$OUT/cartpole_time_to_450.jsonl"
  done
  $RLLIB benchmarks/rllib_baseline.py --algo APPO --env CartPole-v1 --env-runners 2 --seconds 300 \
    --target-return 450 | tail -1 >> "$OUT/cartpole_time_to_450.jsonl"
done
$PY benchmarks/summarize.py
