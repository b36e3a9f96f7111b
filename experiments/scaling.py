"""Claim (3): more actors help, with diminishing returns.

    python experiments/scaling.py --out runs/scaling [--env MinAtar/Breakout-v1] [--actors 1,2,4,8]
        [--algo impala] [--seeds 1,2,3] [--steps 1000000]

One run per actor count and seed, everything else fixed (the envs per actor too, so more actors
means more envs). The table gives the throughput (env steps/s, mean over the run) beside the
final return and the wall time to a common return; with two cores, throughput stops growing
once the actors and the learner fill them. Writes ``ENV-steps.png``, ``ENV-time.png``, ``table.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import TABLE_HEADER, compare, write_table

from impactrl.envs.tasks import task_labels
from impactrl.plotting import read_records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scaling"))
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--actors", default="1,2,4,8")
    parser.add_argument("--algo", default="impala")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {f"{count}-actors": ["--algo", args.algo, "--num-actors", count] for count in args.actors.split(",")}
    lines = TABLE_HEADER + compare(args.out, args.env, variants, seeds, args.steps,
                                   f"{args.algo} on {args.env} with {args.actors} actors, seeds {args.seeds}")
    label = task_labels([args.env])[0]
    lines += ["", "| variant | env steps/s (mean over the run and seeds) |", "|---|---|"]
    for name in variants:
        ends = [read_records(args.out / f"{label}-{name}-s{seed}")[-1] for seed in seeds]
        lines.append(f"| {name} | {np.mean([end['env_steps'] / end['wall_time_s'] for end in ends]):,.0f} |")
    write_table(args.out, lines)


if __name__ == "__main__":
    main()
