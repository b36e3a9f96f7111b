#!/usr/bin/env bash
# The GPU pass (issue 51): one prepared script for a machine with a CUDA GPU, run as is from any
# directory, under 8 minutes on 16 cores and one H100 (each step has its budget; a step that would
# end past GPU_SH_BUDGET_S, 470 s by default, is skipped):
#   1. the CUDA tests (the tests that skip themselves without CUDA)                  <= 75 s
#   2. Pong IMPALA, CUDA learner, 14 actor processes, 60 s, float32                   <= 95 s
#   3. the same with --learner-precision bfloat16                                     <= 95 s
#   4. the same (float32) with --central-inference, if train has that flag            <= 95 s
#   5. the learner's intake (as benchmarks/intake.py): 64 synthetic actors,
#      --no-learning, CUDA learner, 45 s                                              <= 75 s
# Each step appends one JSON line to benchmarks/results/gpu.jsonl (benchmarks/gpu_report.py
# writes it: env steps/s, the learner's idle share, mean GPU utilisation from nvidia-smi sampled
# every 0.5 s, precision, actors, commit, date) and prints it. Where $OUT is a directory (the device
# tool's), this run's lines and its log are also copied there: gpu.jsonl, gpu.log.
#   bash benchmarks/gpu.sh
# Without a CUDA GPU it prints one line and exits 1, having measured nothing. On a machine without
# network it installs wheels carried in .whl/ (see benchmarks/README.md, "The GPU pass"); Atari
# runs on EnvPool where it imports, else on Gymnasium's ALE (the line's env_backend says which).
set -euo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${GPU_SH_BUDGET_S:-470}

# --- the Python that has impactrl ---------------------------------------------------------------
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi
PY=python
command -v python > /dev/null || PY=python3

no_cuda() {
  echo "gpu.sh: no CUDA GPU here (torch.cuda.is_available() is False); nothing measured" >&2
  exit 1
}
has_torch() { $PY -c "import torch" 2> /dev/null; }
has_cuda() { $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; }

# The first CUDA step: where torch is already there, nothing is installed before it.
if has_torch && ! has_cuda; then no_cuda; fi

if ! $PY -c "import impactrl" 2> /dev/null; then
  if compgen -G ".whl/*.whl" > /dev/null; then
    # A lent device: nothing can be fetched there; the missing packages travel as wheels.
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/impactrl-site .whl/*.whl
    export PYTHONPATH="/tmp/impactrl-site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    # README.md's install line (its torch step skipped where a torch is already there).
    if has_torch; then python3 -m venv --system-site-packages .venv; else python3 -m venv .venv; fi
    . .venv/bin/activate
    PY=python
    has_torch || pip install torch==2.13.0
    pip install -e ".[dev]"
  fi
fi
has_torch || { echo "gpu.sh: $PY cannot import torch; install the project as README.md says; nothing measured" >&2; exit 1; }
has_cuda || no_cuda

# --- where results go ---------------------------------------------------------------------------
RESULTS=benchmarks/results/gpu.jsonl
mkdir -p benchmarks/results
WORK=$(mktemp -d)
LOG=$WORK/gpu.log
THIS_RUN=$WORK/gpu.jsonl
touch "$LOG" "$THIS_RUN"
GPU_INDEX=${CUDA_VISIBLE_DEVICES:-0}
GPU_INDEX=${GPU_INDEX%%,*}
SAMPLER=""
failures=0

stop_sampler() {
  if [ -n "$SAMPLER" ]; then
    kill "$SAMPLER" 2> /dev/null || true
    wait "$SAMPLER" 2> /dev/null || true
    SAMPLER=""
  fi
}
finish() {
  stop_sampler
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "$THIS_RUN" "$OUT/gpu.jsonl"; cp "$LOG" "$OUT/gpu.log"; fi
}
trap finish EXIT

say() { echo "gpu.sh [$(printf '%3d' "$SECONDS") s]: $*"; }

# measure NAME BUDGET_S [gpu_report.py flags] -- COMMAND...: run COMMAND under `timeout BUDGET_S`
# with nvidia-smi sampling, then append its JSON line to the results.
measure() {
  local name=$1 budget=$2 rc=0 line
  shift 2
  local report=()
  while [ "$1" != -- ]; do report+=("$1"); shift; done
  shift
  if [ $((SECONDS + budget)) -gt "$BUDGET_S" ]; then
    say "$name skipped: its ${budget} s would end past the ${BUDGET_S} s budget"
    return 0
  fi
  say "$name (at most ${budget} s): $*"
  local out=$WORK/$name.out err=$WORK/$name.err smi=$WORK/$name.smi
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi -i "$GPU_INDEX" --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
      -lms 500 > "$smi" 2> /dev/null &
    SAMPLER=$!
  fi
  timeout -k 15 "$budget" "$@" > "$out" 2> "$err" || rc=$?
  stop_sampler
  { echo "=== $name: $* (exit $rc)"; cat "$out" "$err"; } >> "$LOG"
  if [ "$rc" -ne 0 ]; then
    failures=$((failures + 1))
    say "$name FAILED (exit $rc$([ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo ", timed out")); its last lines:"
    tail -n 15 "$err" "$out" | sed 's/^/    /'
  fi
  line=$($PY benchmarks/gpu_report.py --measurement "$name" --output "$out" --gpu-samples "$smi" --rc "$rc" \
    --log "$err" --gpu-index "$GPU_INDEX" "${report[@]}")
  echo "$line" >> "$THIS_RUN"
  echo "$line" >> "$RESULTS"
  echo "$line"
}

if $PY -c "import envpool" 2> /dev/null; then BACKEND=envpool; else BACKEND=gymnasium; fi
TORCH=$($PY -c "import torch; print(torch.__version__)")
say "$(nvidia-smi -i "$GPU_INDEX" --query-gpu=name --format=csv,noheader 2> /dev/null || echo "GPU (no nvidia-smi)"), torch $TORCH, $(nproc) cores, Atari on $BACKEND; results to $RESULTS"
COMMON=(--set "torch=\"$TORCH\"" --set "env_backend=\"$BACKEND\"" --set 'device="cuda"')

# 1. The CUDA tests: those in files that skip on torch.cuda.is_available(), named for CUDA or a device.
mapfile -t CUDA_TEST_FILES < <(grep -l "torch.cuda.is_available()" tests/*.py)
if [ "${#CUDA_TEST_FILES[@]}" -gt 0 ]; then
  measure cuda-tests 75 --kind pytest "${COMMON[@]}" -- \
    $PY -m pytest -q -rs -p no:cacheprovider -m "slow or not slow" -k "cuda or device" "${CUDA_TEST_FILES[@]}"
else
  say "cuda-tests skipped: no test file checks torch.cuda.is_available()"
fi

# 2-4. Pong IMPALA with a CUDA learner and 14 actor processes.
PONG=(-m impactrl bench --env ALE/Pong-v5 --algo impala --env-backend "$BACKEND" --device cuda --num-actors 14
      --seconds 60 --warmup-seconds 15 --json)
for precision in float32 bfloat16; do
  measure "pong-impala-$precision" 95 --frames-per-step 4 "${COMMON[@]}" --set "precision=\"$precision\"" \
    --set actors=14 --set central_inference=false -- $PY "${PONG[@]}" --learner-precision "$precision"
done
if $PY -m impactrl train --help 2> /dev/null | grep -q -- "--central-inference"; then
  measure pong-impala-float32-central 95 --frames-per-step 4 "${COMMON[@]}" --set 'precision="float32"' \
    --set actors=14 --set central_inference=true -- $PY "${PONG[@]}" --learner-precision float32 --central-inference
else
  say "pong-impala-float32-central skipped: impactrl train has no --central-inference flag (benchmarks/central_inference.py measures the layout on the CPU alone)"
fi

# 5. The learner's intake with a CUDA learner, as benchmarks/intake.py runs it (local runtime).
measure intake-cuda-64 75 --publish-ms "${COMMON[@]}" --set 'precision="float32"' -- \
  $PY -m impactrl bench --env ALE/Pong-v5 --algo impala --env-backend "$BACKEND" --no-learning --json --device cuda \
  --synthetic-actors 64 --actors-per-process 8 --seconds 45 --warmup-seconds 15

say "done: $(wc -l < "$THIS_RUN") lines appended to $RESULTS, $failures step(s) failed; the log: $LOG"
[ "$failures" -eq 0 ]
