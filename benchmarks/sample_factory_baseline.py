"""Sample Factory 2.1.1's APPO on CartPole-v1 and Pong, for the side-by-side tables.

Runs in its own venv (benchmarks/.venv-sf: sample-factory 2.1.1 needs gymnasium 0.29 and
numpy 1.26, plus ale-py 0.10 for its ROMs; run.sh builds it), so it cannot use impactrl's envs: CartPole is gymnasium's and
Pong is Sample Factory's own Atari stack (PongNoFrameskip-v4, 30 no-ops, frame skip 4 with
max-pool, episodic life, fire reset, 84x84 grey, 4 frames; no sticky actions) with its default
Atari network (the Nature CNN: 32-64-64 convolutions and 512 units, larger than impactrl's
IMPALA shallow CNN). CartPole uses Sample Factory's own example settings (train_gym_env.py)
with 8 envs per worker instead of 20.

    benchmarks/.venv-sf/bin/python benchmarks/sample_factory_baseline.py --env ALE/Pong-v5 --seconds 60
    benchmarks/.venv-sf/bin/python benchmarks/sample_factory_baseline.py --env CartPole-v1 --target-return 450 --seconds 300

Throughput counts agent steps (``--summaries_use_frameskip False``) between Sample Factory's
first report after the warm-up and its last; the time to a return is from this script's start
to the first report whose average episode return (its last 100 episodes) reaches the target
(reported as start-up, up to Sample Factory's first report, plus training time after it).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime

try:  # registers the ALE ids with gymnasium; at import, so Sample Factory's spawned workers get them too
    import ale_py  # noqa: F401
except ImportError:
    pass

COMMON = ["--algo=APPO", "--device=cpu", "--save_every_sec=100000", "--summaries_use_frameskip=False"]
PER_ENV = {
    "CartPole-v1": ["sf_examples.train_gym_env", "--env=CartPole-v1", "--use_rnn=False", "--recurrence=1",
                    "--with_vtrace=False", "--batch_size=512", "--reward_scale=0.1"],
    "ALE/Pong-v5": ["sf_examples.atari.train_atari", "--env=atari_pong", "--async_rl=True"],
}
FRAMES = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\].*Fps is .*Total num frames: (\d+)\.")
REWARD = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\].*Avg episode reward: \[\(0, '([-\d.na]+)'\)\]")


def timestamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(PER_ENV), default="CartPole-v1")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup-seconds", type=float, default=15.0)
    parser.add_argument("--target-return", type=float, default=None)
    args = parser.parse_args()

    started = time.time()
    module, *env_args = PER_ENV[args.env]
    command = [sys.executable, __file__, "--run-module", module, *env_args, *COMMON, f"--num_workers={args.workers}",
               f"--num_envs_per_worker={args.envs_per_worker}", f"--train_dir={tempfile.mkdtemp(prefix='sf-')}",
               "--experiment=bench", f"--train_for_seconds={int(args.seconds + args.warmup_seconds + 60)}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frames: list[tuple[float, int]] = []
    reached = None
    first_report = None
    for line in process.stdout:
        if match := FRAMES.search(line):
            frames.append((timestamp(match[1]), int(match[2])))
            first_report = first_report or frames[-1][0]
        elif (match := REWARD.search(line)) and args.target_return is not None and reached is None:
            if match[2] != "nan" and float(match[2]) >= args.target_return:
                reached = timestamp(match[1])
        done = args.target_return is not None and reached is not None
        if done or (frames and frames[-1][0] - started >= args.seconds + args.warmup_seconds):
            break
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
    steady = [f for f in frames if f[0] - started >= args.warmup_seconds]
    rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0]) if len(steady) > 1 else None
    print(json.dumps({"system": "sample-factory-appo", "env": args.env, "env_runners": args.workers,
                      "envs_per_worker": args.envs_per_worker, "env_steps_per_s": rate,
                      "env_steps": frames[-1][1] if frames else None, "wall_s": time.time() - started,
                      "time_to_target_s": (reached - first_report) if reached else None,
                      "target_return": args.target_return,
                      "startup_s": (first_report - started) if first_report else None}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-module"]:  # the training process: Sample Factory's own entry point
        sys.argv = sys.argv[2:]
        # Imported, not run as __main__: Sample Factory pickles the env factory by its module.
        sys.exit(importlib.import_module(sys.argv[0]).main())
    else:
        main()
