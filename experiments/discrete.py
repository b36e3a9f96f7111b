"""Claim (1): IMPACT needs less wall time than IMPALA on discrete tasks for equal or better reward.

    python experiments/discrete.py --out runs/discrete [--games MinAtar/Breakout-v1,...]
        [--algos impala,impact] [--seeds 1,2,3] [--steps 1000000] [--num-actors 2]
        [--extra "--env-backend envpool"]

One run per algorithm, game and seed (each algorithm with its presets for the game's family,
``--num-actors`` actors), skipped when finished and continued when stopped
(experiments/common.py). Writes, per game, ``GAME-steps.png`` and ``GAME-time.png`` (``impactrl
plot`` over env steps and over wall time) and ``table.md``: the final return (last 10% of the
steps) and wall time per algorithm as mean ± std over seeds, and the wall time each needs to
reach a common return, 90% of the lowest of the algorithms' mean final returns.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from common import compare_algorithms

DEFAULT_GAMES = "MinAtar/Breakout-v1,MinAtar/SpaceInvaders-v1,MinAtar/Asterix-v1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/discrete"))
    parser.add_argument("--games", default=DEFAULT_GAMES)
    parser.add_argument("--algos", default="impala,impact")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--extra", default="", help="more impactrl train flags for every run, e.g. '--env-backend envpool'")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    compare_algorithms(args.out, args.games.split(","), args.algos.split(","), seeds, args.steps,
                       ["--num-actors", str(args.num_actors), *shlex.split(args.extra)])


if __name__ == "__main__":
    main()
