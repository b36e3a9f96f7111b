"""One agent on the five MinAtar games, with and without PopArt, against one agent per game.

    python experiments/multitask.py --out runs/multitask [--algo impala] [--steps-per-game 2000000]

Runs (each skipped when finished, continued with --resume when stopped part-way):

- ``suite``:         impactrl train --algo ALGO --env minatar (2 actors, 30 envs each: 12 per game)
- ``suite-popart``:  the same with --popart
- ``single-GAME``:   impactrl train --algo ALGO --env MinAtar/GAME-v1 for steps-per-game steps

Then it writes ``curves.png`` (``impactrl plot``: a panel per game, each run's return over the
game's own env steps) and ``table.md``: per game, the mean return over the last 10% of its
steps for each run, and the ratio multi-task / single-task; the summary is the mean ratio.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import yaml
from common import final_return, impactrl, train

from impactrl.envs.tasks import SUITES, task_labels
from impactrl.plotting import read_records

GAMES = SUITES["minatar"]


def table(out: Path, steps_per_game: int) -> str:
    labels = task_labels(GAMES)
    singles = {label: final_return(read_records(out / f"single-{label}"), steps_per_game) for label in labels}
    suites = {name: read_records(out / name) for name in ("suite", "suite-popart")}
    lines = ["| game | single-task | multi-task | ratio | multi-task, PopArt | ratio |", "|---|---|---|---|---|---|"]
    ratios: dict[str, list[float]] = {name: [] for name in suites}
    for label in labels:
        cells = [label, f"{singles[label]:.2f}"]
        for name, records in suites.items():
            value = final_return(records, steps_per_game, label)
            ratio = value / singles[label] if value is not None and singles[label] else None
            if ratio is not None:
                ratios[name].append(ratio)
            cells += [f"{value:.2f}" if value is not None else "-", f"{ratio:.2f}" if ratio is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    means = {name: float(np.mean(values)) if values else None for name, values in ratios.items()}
    lines.append(f"| **mean ratio** | | | **{means['suite']:.2f}** | | **{means['suite-popart']:.2f}** |")
    for name in suites:
        last = suites[name][-1]
        lines.append(f"\n{name}: {last['env_steps']:,} env steps in {last['wall_time_s'] / 60:.1f} min")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"mean_ratio": means, "single": singles}))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/multitask"))
    parser.add_argument("--algo", default="impala", choices=("impala", "impact"))
    parser.add_argument("--steps-per-game", type=int, default=2_000_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    out, steps = args.out, args.steps_per_game
    out.mkdir(parents=True, exist_ok=True)
    common = ["--algo", args.algo, "--seed", str(args.seed), "--num-actors", "2"]
    suite_steps = steps * len(GAMES)
    train(out / "suite", suite_steps, [*common, "--env", "minatar"])
    train(out / "suite-popart", suite_steps, [*common, "--env", "minatar", "--popart"])
    for game, label in zip(GAMES, task_labels(GAMES)):
        train(out / f"single-{label}", steps, [*common, "--env", game])
    runs = [out / "suite", out / "suite-popart", *(out / f"single-{label}" for label in task_labels(GAMES))]
    impactrl("plot", *map(str, runs), "--out", str(out / "curves.png"),
             "--title", f"{args.algo}: one agent on five MinAtar games vs one agent per game")
    print(table(out, steps))
    print(yaml.safe_dump({"written": [str(out / "curves.png"), str(out / "table.md")]}))


if __name__ == "__main__":
    main()
