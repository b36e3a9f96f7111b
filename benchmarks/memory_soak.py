"""Memory over a long run: does any process grow when one side is much slower than the other?

Runs two trainings side by side for ``--minutes`` each: one with a deliberately slow learner
(a wide MLP on one thread: actors wait for free slots) and one with deliberately slow actors
(one actor, one MuJoCo env, batches of 16 unrolls: the learner waits for data). Every
``--every-s`` seconds it samples the proportional set size (PSS: shared pages split between the
processes that map them, so shared memory is not counted twice) of the training process and
all its descendants, from /proc (Linux). Writes one JSON line per sample and prints, per
scenario, the PSS range after the warm-up relative to its mean.

    python benchmarks/memory_soak.py --minutes 20 --out benchmarks/results/memory_soak.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from impactrl.metrics import read_metrics

SCENARIOS = {
    "slow_learner": ["--algo", "impala", "--env", "CartPole-v1", "--num-actors", "2", "--hidden-sizes", "1024", "1024",
                     "--learner-threads", "1"],
    "slow_actors": ["--algo", "impala", "--env", "Hopper-v5", "--num-actors", "1", "--envs-per-actor", "1",
                    "--unrolls-per-batch", "16", "--unroll-length", "64"],
}


def descendants(pid: int) -> list[int]:
    found, frontier = [pid], [pid]
    while frontier:
        parent = frontier.pop()
        children = Path(f"/proc/{parent}/task/{parent}/children")
        if children.exists():
            kids = [int(p) for p in children.read_text().split()]
            found += kids
            frontier += kids
    return found


def pss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass  # the process ended between listing and reading
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--every-s", type=float, default=10.0)
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/memory_soak.jsonl"))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="impactrl-soak-"))
    seconds = int(args.minutes * 60)
    runs = {
        name: subprocess.Popen([sys.executable, "-m", "impactrl", "train", *flags, "--out", str(scratch / name),
                                "--total-env-steps", str(10**12), "--max-wall-time-s", str(seconds),
                                "--log-interval-s", "30"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name, flags in SCENARIOS.items()
    }
    began = time.monotonic()
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as out:
        while any(run.poll() is None for run in runs.values()):
            elapsed = time.monotonic() - began
            for name, run in runs.items():
                if run.poll() is None:
                    pids = descendants(run.pid)
                    total = sum(pss_mb(pid) for pid in pids)
                    samples[name].append((elapsed, total, len(pids)))
                    out.write(json.dumps({"scenario": name, "t_s": round(elapsed, 1), "pss_mb": round(total, 1),
                                          "processes": len(pids)}) + "\n")
                    out.flush()
            time.sleep(args.every_s)
    for name, run in runs.items():
        if run.returncode != 0:
            print(f"{name}: exit code {run.returncode}\n{run.stderr.read()[-2000:]}")
        metrics = read_metrics(scratch / name / "metrics.jsonl")
        waits = [m["time/learner_wait_fraction"] for m in metrics[1:]]
        steady = [pss for t, pss, _ in samples[name] if t >= args.warmup_minutes * 60]
        mean = sum(steady) / len(steady)
        print(f"{name}: {len(steady)} samples after {args.warmup_minutes:g} min, PSS mean {mean:.0f} MB, "
              f"min {min(steady):.0f} ({min(steady) / mean - 1:+.1%}), max {max(steady):.0f} "
              f"({max(steady) / mean - 1:+.1%}); first-to-last {steady[-1] / steady[0] - 1:+.1%}; "
              f"learner waiting {sum(waits) / len(waits):.0%} of the time; {metrics[-1]['env_steps']:,} env steps")


if __name__ == "__main__":
    main()
