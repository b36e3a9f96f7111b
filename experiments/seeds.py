"""Claim: each preset reaches its bar on every seed, also with another training run beside it.

    python experiments/seeds.py --out runs/seeds [--env CartPole-v1] [--algos impala,impact]
        [--seeds 1-10] [--steps 500000] [--bar 450] [--num-actors 2] [--beside] [--extra "FLAGS"]

One run per algorithm and seed with the algorithm's preset for the env (skipped when finished,
continued when stopped: experiments/common.py). ``--beside`` keeps a second training run (IMPALA
on the same env, a budget it never reaches) going for the whole sweep, as on a busy machine.
Writes ``table.md``: per run the best mean of 100 consecutive training episodes, the mean of
the last 100, the env steps at which the bar was first reached, and per algorithm how many
seeds reached it.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

from common import EPISODES, hundred_episode_means, train, write_table
from impactrl.plotting import read_records

def parse_seeds(text: str) -> list[int]:
    """``1-10`` or ``1,2,5``."""
    if "-" in text:
        first, last = map(int, text.split("-"))
        return list(range(first, last + 1))
    return [int(seed) for seed in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/seeds"))
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--algos", default="impala,impact")
    parser.add_argument("--seeds", default="1-10")
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--bar", type=float, default=450.0)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--beside", action="store_true", help="keep a second training run going beside the sweep")
    parser.add_argument("--extra", default="", help="more impactrl train flags for every run (a candidate preset)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    seeds, algos = parse_seeds(args.seeds), args.algos.split(",")
    beside = None
    if args.beside:
        beside = subprocess.Popen([sys.executable, "-m", "impactrl", "train", "--env", args.env, "--quiet",
                                   "--total-env-steps", str(10**12), "--out", str(args.out / "beside")],
                                  stdout=subprocess.DEVNULL)
    try:
        for algo in algos:
            for seed in seeds:
                train(args.out / f"{algo}-s{seed}", args.steps, ["--algo", algo, "--env", args.env, "--seed", str(seed),
                                                                  "--num-actors", str(args.num_actors),
                                                                  "--log-interval-s", "1", *shlex.split(args.extra)])
    finally:
        if beside is not None:
            beside.terminate()
            beside.wait()
    lines = [f"| algo | seed | best {EPISODES}-episode mean | last {EPISODES} | reached {args.bar:g} at (env steps) |",
             "|---|---|---|---|---|"]
    reached = dict.fromkeys(algos, 0)
    for algo in algos:
        for seed in seeds:
            means = hundred_episode_means(read_records(args.out / f"{algo}-s{seed}"))
            best = max((mean for _, mean in means), default=np.nan)
            first = next((steps for steps, mean in means if mean >= args.bar), None)
            reached[algo] += first is not None
            lines.append(f"| {algo} | {seed} | {best:.1f} | {means[-1][1] if means else np.nan:.1f} | "
                         f"{f'{first:,}' if first is not None else 'no'} |")
    lines.append("")
    lines += [f"{algo}: {reached[algo]} of {len(seeds)} seeds reached {args.bar:g}" for algo in algos]
    write_table(args.out, lines)


if __name__ == "__main__":
    main()
