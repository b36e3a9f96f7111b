"""Beyond Pong: each preset on Atari games with what a user types, beside CleanRL PPO's scores.

    python experiments/atari.py --out runs/atari [--games ALE/Breakout-v5,ALE/SpaceInvaders-v5]
        [--algos impala,impact] [--seeds 1] [--steps 10000000] [--eval-every 2500000] [--report-only]

Each run is ``impactrl train --algo A --env ID --env-backend envpool --sticky-action-prob 0 --seed S
--total-env-steps N`` (no sticky actions, as CleanRL's numbers) plus ``--milestone-env-steps``, which
keeps a checkpoint every ``--eval-every`` env steps; runs are skipped when finished and continued
when stopped (experiments/common.py), one at a time. Then, per run: ``impactrl eval`` over 30 games
of each milestone checkpoint, the best and last 100-game training mean, wall time and env steps/s,
into ``table.md``, with claim (1) where a game and seed have both presets' runs; ``GAME-steps.png``
and ``GAME-time.png``; and ``RUN.csv``, the run's curve downsampled to one row per 100k env steps
(small enough to keep in the repository).
``--report-only`` trains nothing: the table, CSVs and figures of the runs as far as they got.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

from common import EPISODES, hundred_episode_means, impactrl, train

from impactrl.envs.tasks import task_labels
from impactrl.plotting import read_records

# CleanRL's PPO after 10M env steps, v4 games without sticky actions, 3 seeds (its docs' benchmark
# pages; EnvPool variant where the plain one has no number).
CLEANRL_PPO = {"Breakout": 414.7, "SpaceInvaders": 1188.8, "Pong": 20.4, "BeamRider": 1915.9, "Qbert": 17246.0}
EVAL_GAMES = 30
CSV_STEP = 100_000
CSV_KEYS = ("env_steps", "wall_time_s", "episode_return_mean", "episodes", "env_steps_per_s", "policy_lag_mean",
            "episode_length_mean", "loss/entropy", "optim/learning_rate")


def evaluate_milestones(run_dir: Path) -> dict[int, dict]:
    """``impactrl eval`` over ``EVAL_GAMES`` games of each milestone checkpoint, its JSON kept in ``RUN/milestones.json``."""
    saved_path = run_dir / "milestones.json"
    saved = {int(k): v for k, v in json.loads(saved_path.read_text()).items()} if saved_path.exists() else {}
    for checkpoint in sorted((run_dir / "checkpoints").glob("steps_*.pt")):
        steps = int(checkpoint.stem.removeprefix("steps_"))
        if not isinstance(saved.get(steps), dict):  # absent, or a bare mean from before the JSON was kept
            print(f"+ impactrl eval {checkpoint} --episodes {EVAL_GAMES}", flush=True)
            output = subprocess.run([sys.executable, "-m", "impactrl", "eval", str(checkpoint), "--episodes",
                                     str(EVAL_GAMES)], check=True, capture_output=True, text=True).stdout
            saved[steps] = json.loads(output.strip().splitlines()[-1])
            saved_path.write_text(json.dumps(saved, indent=1))
    return saved


def describe_eval(result: dict) -> str:
    """``mean ± std``, and how many games the frame cap cut, if any."""
    cut = result.get("episodes_cut", 0)
    return f"{result['return_mean']:.1f} ± {result['return_std']:.1f}" + (f" ({cut} cut)" if cut else "")


def write_csv(records: list[dict], path: Path) -> None:
    """The last metrics line of every ``CSV_STEP`` env steps, and the 100-game mean as of it (the
    latest one at or before it: a line that ended no game keeps the games before it)."""
    means = dict(hundred_episode_means(records))
    rows, next_step, latest = [], CSV_STEP, None
    for index, record in enumerate(records):
        latest = means.get(record["env_steps"], latest)
        last = index == len(records) - 1
        if record["env_steps"] >= next_step or last:
            rows.append({**{key: record.get(key) for key in CSV_KEYS}, "return_100_games": latest})
            next_step = (record["env_steps"] // CSV_STEP + 1) * CSV_STEP
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=[*CSV_KEYS, "return_100_games"])
        writer.writeheader()
        writer.writerows(rows)


def first_reaching(records: list[dict], target: float) -> tuple[int, float] | None:
    """Env steps and wall time (s) of the first 100-game training mean at or above ``target``."""
    walls = {record["env_steps"]: record["wall_time_s"] for record in records}
    return next(((steps, walls[steps]) for steps, mean in hundred_episode_means(records) if mean >= target), None)


def claim_one(label: str, seed: int, impala: list[dict], impact: list[dict]) -> str:
    """Claim (1) of the source documents on one game and seed: when IMPACT's 100-game mean first
    reached IMPALA's last one, in env steps and wall time, against IMPALA's whole run."""
    means = hundred_episode_means(impala)
    if not means:
        return f"- {label}, seed {seed}: IMPALA has no 100-game mean yet"
    target, total = means[-1][1], impala[-1]
    reached = first_reaching(impact, target)
    if reached is None:
        return f"- {label}, seed {seed}: IMPACT never reached IMPALA's last 100-game mean, {target:.1f}"
    steps, wall = reached
    return (f"- {label}, seed {seed}: IMPACT reached IMPALA's last 100-game mean, {target:.1f}, at {steps:,} env steps "
            f"({steps / total['env_steps']:.2f}x IMPALA's {total['env_steps']:,}) and {wall / 3600:.2f} h "
            f"({wall / total['wall_time_s']:.2f}x IMPALA's {total['wall_time_s'] / 3600:.2f} h)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/atari"))
    parser.add_argument("--games", default="ALE/Breakout-v5,ALE/SpaceInvaders-v5")
    parser.add_argument("--algos", default="impala,impact")
    parser.add_argument("--seeds", default="1")
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--eval-every", type=int, default=2_500_000)
    parser.add_argument("--report-only", action="store_true", help="train nothing; report the runs as far as they got")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    claims = ["", "Claim (1), IMPACT's time to IMPALA's final score (wall times compare only from one machine):"]
    lines = ["| game | algo | seed | best 100-game mean | last 100-game mean | CleanRL PPO | eval (30 games) at env steps "
             "| env steps | wall time (h) | env steps/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for env in args.games.split(","):
        label = task_labels([env])[0]
        runs, records_of = [], {}
        for algo in args.algos.split(","):
            for seed in map(int, args.seeds.split(",")):
                run_dir = args.out / f"{label}-{algo}-s{seed}"
                if not args.report_only:
                    train(run_dir, args.steps, ["--algo", algo, "--env", env, "--env-backend", "envpool",
                                                "--sticky-action-prob", "0", "--seed", str(seed),
                                                "--milestone-env-steps", str(args.eval_every)])
                elif not (run_dir / "metrics.jsonl").exists():
                    continue
                runs.append(run_dir)
                records = records_of[algo, seed] = read_records(run_dir)
                write_csv(records, args.out / f"{run_dir.name}.csv")
                means = [mean for _, mean in hundred_episode_means(records)]
                evals = ", ".join(f"{describe_eval(result)} at {steps / 1e6:g}M" for steps, result in
                                  sorted(evaluate_milestones(run_dir).items()))
                last = records[-1]
                lines.append(f"| {label} | {algo} | {seed} | {max(means, default=float('nan')):.1f} | "
                             f"{means[-1] if means else float('nan'):.1f} | {CLEANRL_PPO.get(label, '-')} | {evals} | "
                             f"{last['env_steps']:,} | {last['wall_time_s'] / 3600:.2f} | "
                             f"{last['env_steps'] / last['wall_time_s']:,.0f} |")
        claims += [claim_one(label, seed, records_of["impala", seed], records_of["impact", seed])
                   for seed in map(int, args.seeds.split(","))
                   if ("impala", seed) in records_of and ("impact", seed) in records_of]
        for x, suffix in (("env_steps", "steps"), ("wall_time_s", "time")) if runs else ():
            impactrl("plot", *map(str, runs), "--x", x, "--smooth", "500000", "--out", str(args.out / f"{label}-{suffix}.png"),
                     "--title", f"{env}: {args.algos}, seeds {args.seeds} ({EPISODES}-game means in the table)")
    text = "\n".join(lines + (claims if len(claims) > 2 else [])) + "\n"
    (args.out / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
