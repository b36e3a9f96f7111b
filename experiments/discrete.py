"""Claim (1): IMPACT needs less wall time than IMPALA on discrete tasks for equal or better reward.

    python experiments/discrete.py --out runs/discrete [--games MinAtar/Breakout-v1,...]
        [--algos impala,impact] [--seeds 1,2,3] [--steps 1000000]

One run per algorithm, game and seed (each algorithm with its presets for the game's family,
2 actors), skipped when finished and continued when stopped (experiments/common.py). Writes,
per game, ``GAME-steps.png`` and ``GAME-time.png`` (``impactrl plot`` over env steps and over wall
time) and ``table.md``: the final return (last 10% of the steps) and wall time per algorithm as
mean ± std over seeds, and the wall time each needs to reach a common return, 90% of the lowest
of the algorithms' mean final returns.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import final_return, impactrl, mean_std, time_to_return, train

from impactrl.envs.tasks import task_labels
from impactrl.plotting import read_records

DEFAULT_GAMES = "MinAtar/Breakout-v1,MinAtar/SpaceInvaders-v1,MinAtar/Asterix-v1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/discrete"))
    parser.add_argument("--games", default=DEFAULT_GAMES)
    parser.add_argument("--algos", default="impala,impact")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--num-actors", type=int, default=2)
    args = parser.parse_args()
    games, algos = args.games.split(","), args.algos.split(",")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    runs = {(game, algo, seed): args.out / f"{label}-{algo}-s{seed}"
            for game, label in zip(games, task_labels(games)) for algo in algos for seed in seeds}
    for (game, algo, seed), run_dir in runs.items():
        train(run_dir, args.steps, ["--algo", algo, "--env", game, "--seed", str(seed),
                                    "--num-actors", str(args.num_actors)])
    lines = ["| game | algo | final return | wall time (s) | time to common return (s) | common return |",
             "|---|---|---|---|---|---|"]
    for game, label in zip(games, task_labels(games)):
        game_runs = [runs[game, algo, seed] for algo in algos for seed in seeds]
        for x, suffix in (("env_steps", "steps"), ("wall_time_s", "time")):
            impactrl("plot", *map(str, game_runs), "--x", x, "--out", str(args.out / f"{label}-{suffix}.png"),
                     "--title", f"{label}: {', '.join(algos)}, seeds {args.seeds}")
        records = {(algo, seed): read_records(runs[game, algo, seed]) for algo in algos for seed in seeds}
        finals = {key: final_return(value, args.steps) for key, value in records.items()}
        means = [np.mean([finals[algo, seed] for seed in seeds if finals[algo, seed] is not None] or [np.nan])
                 for algo in algos]
        target = 0.9 * float(np.nanmin(means))
        for algo in algos:
            times = [time_to_return(records[algo, seed], target) for seed in seeds]
            walls = [records[algo, seed][-1]["wall_time_s"] for seed in seeds]
            lines.append(f"| {label} | {algo} | {mean_std([finals[algo, seed] for seed in seeds])} | "
                         f"{mean_std(walls, 0)} | {mean_std(times, 0)} | {target:.2f} |")
    text = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
