#!/usr/bin/env bash
# Side-by-side measurements on this machine, one after another (never in CI):
# the raw env ceiling, impactrl's training throughput and time to CartPole 450, the learner's
# overhead over a bare PyTorch loop, and the same for RLlib's APPO and IMPALA (installed here into
# a venv of its own: RLlib pins gymnasium 1.2.2). RLlib gets as many envs per env runner as
# impactrl's preset gives each actor (8 CartPole, 32 MinAtar, 8 Pong), and APPO also runs with
# RLlib's default of one.
# Sample Factory 2.1.1 (part "sf") gets a venv of its own too (gymnasium 0.29, numpy 1.26, ale-py 0.10
# for the ROMs); it runs CartPole and Pong (its Atari stack and network; no MinAtar).
#   bash benchmarks/run.sh [SECONDS] [PARTS]    PARTS: any of "ceiling impactrl rllib sf central time learner" (default all)
#   ENVS="ALE/Pong-v5" bash benchmarks/run.sh   only these envs in the throughput part
# Results are appended to benchmarks/results/*.jsonl; the tables: python benchmarks/summarize.py
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-90}
PARTS=${2:-"ceiling impactrl rllib sf central time learner"}
OUT=benchmarks/results
mkdir -p "$OUT"
PY=${PYTHON:-python}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
declare -A ENVS_PER_WORKER=([CartPole-v1]=8 [MinAtar/Breakout-v1]=32 [ALE/Pong-v5]=8)

if wants rllib && [ ! -x benchmarks/.venv-rllib/bin/python ]; then
  python3 -m venv benchmarks/.venv-rllib
  benchmarks/.venv-rllib/bin/pip install -q torch==2.13.0
  benchmarks/.venv-rllib/bin/pip install -q "ray[rllib]==2.60.0" ale-py minatar opencv-python-headless
  benchmarks/.venv-rllib/bin/pip install -q --no-deps -e .
fi
RLLIB=benchmarks/.venv-rllib/bin/python
if wants sf && [ ! -x benchmarks/.venv-sf/bin/python ]; then
  python3 -m venv benchmarks/.venv-sf
  benchmarks/.venv-sf/bin/pip install -q torch==2.13.0
  benchmarks/.venv-sf/bin/pip install -q "sample-factory==2.1.1" "gymnasium==0.29.1" "numpy<2" opencv-python-headless
  benchmarks/.venv-sf/bin/pip install -q --no-deps "ale-py==0.10.1"  # ships the ROMs; 0.8 does not
fi
SF=benchmarks/.venv-sf/bin/python

if wants ceiling; then
  for backend in gymnasium envpool; do
    $PY benchmarks/env_ceiling.py --seconds 10 --backend $backend >> "$OUT/env_ceiling.jsonl"
  done
fi

for env in ${ENVS:-CartPole-v1 MinAtar/Breakout-v1 ALE/Pong-v5}; do
  if wants impactrl; then
    # The image envs also with the learner in bfloat16 (this CPU has AMX; see --learner-precision).
    for precision in float32 $([ "$env" != CartPole-v1 ] && echo bfloat16); do
      # Atari also on EnvPool (--env-backend envpool); for CartPole its per-call cost loses to
      # the Python loop, and it has no MinAtar.
      for backend in gymnasium $([[ "$env" == ALE/* ]] && echo envpool); do
        $PY -m impactrl bench --algo impala --env "$env" --num-actors 2 --seconds "$SECONDS_EACH" \
          --learner-precision $precision --env-backend $backend | grep "^{" | tail -1 \
          | sed "s/^{/{\"system\": \"impactrl-impala-$precision$([ $backend = envpool ] && echo -envpool)\", /" \
          >> "$OUT/throughput.jsonl"
      done
    done
  fi
  if wants rllib; then
    for algo in APPO IMPALA; do
      $RLLIB benchmarks/rllib_baseline.py --algo $algo --env "$env" --env-runners 2 \
        --envs-per-runner "${ENVS_PER_WORKER[$env]}" --seconds "$SECONDS_EACH" | grep "^{" | tail -1 >> "$OUT/throughput.jsonl"
    done
    # RLlib's own default, one env per runner (how the issue's table was measured).
    $RLLIB benchmarks/rllib_baseline.py --algo APPO --env "$env" --env-runners 2 --envs-per-runner 1 \
      --seconds "$SECONDS_EACH" | grep "^{" | tail -1 >> "$OUT/throughput.jsonl"
  fi
  if wants sf && [ "$env" != MinAtar/Breakout-v1 ]; then
    $SF benchmarks/sample_factory_baseline.py --env "$env" --envs-per-worker "${ENVS_PER_WORKER[$env]}" \
      --seconds "$SECONDS_EACH" | grep "^{" | tail -1 >> "$OUT/throughput.jsonl"
  fi
done

if wants central; then
  # SEED-style central inference against impactrl's actor-side inference (envs + policy only).
  for env in ${ENVS:-CartPole-v1 MinAtar/Breakout-v1 ALE/Pong-v5}; do
    $PY benchmarks/central_inference.py --env "$env" --seconds 20 | grep "^{" >> "$OUT/central_inference.jsonl"
  done
fi

for seed in 1 2 3; do
  wants time || break
  if wants impactrl; then
    for algo in impala impact; do
      run=$(mktemp -d)/run
      start=$(date +%s.%N)
      $PY -m impactrl train --algo $algo --env CartPole-v1 --num-actors 2 --seed $seed --out "$run" --log-interval-s 1 > /dev/null
      $PY benchmarks/time_to_return.py "$run" 450 --system "impactrl-$algo" --seed $seed --started "$start" \
        >> "$OUT/cartpole_time_to_450.jsonl"
    done
  fi
  if wants rllib; then
    $RLLIB benchmarks/rllib_baseline.py --algo APPO --env CartPole-v1 --env-runners 2 --envs-per-runner 8 \
      --seconds 400 --target-return 450 | grep "^{" | tail -1 >> "$OUT/cartpole_time_to_450.jsonl"
  fi
  if wants sf; then
    $SF benchmarks/sample_factory_baseline.py --env CartPole-v1 --envs-per-worker 8 --seconds 400 \
      --target-return 450 | grep "^{" | tail -1 >> "$OUT/cartpole_time_to_450.jsonl"
  fi
done

if wants learner; then
  for env in CartPole-v1 MinAtar/Breakout-v1 ALE/Pong-v5; do
    $PY benchmarks/learner_overhead.py --env "$env" --steps 200 >> "$OUT/learner_overhead.jsonl"
  done
fi
$PY benchmarks/summarize.py
