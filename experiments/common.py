"""What every experiment script shares: train a run unless it is done, read its curves, write tables.

Each script names its runs as directories under ``--out``; running it again skips the finished
runs, continues stopped ones with ``impactrl train --resume`` and redraws the figures and tables,
so a long study can be stopped and restarted at any point.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from impactrl.plotting import curve, read_records

LAST_FRACTION = 0.1  # a run's final return: the mean of its logged returns over the last 10% of its steps
EPISODES = 100  # Gymnasium's "solved" window, and the Atari papers' 100-game mean


def impactrl(*args: str) -> None:
    print("+ impactrl", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "impactrl", *args], check=True)


def train(run_dir: Path, budget: int, args: list[str]) -> None:
    """``impactrl train ARGS`` for ``budget`` env steps into ``run_dir``, unless it holds a finished
    run; a stopped one is continued with --resume and the same flags (a new Ray address, a larger
    budget)."""
    if (run_dir / "config.yaml").exists():
        records = read_records(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        if records and records[-1]["env_steps"] >= budget:
            print(f"{run_dir}: finished, skipped", flush=True)
            return
        impactrl("train", "--resume", str(run_dir), *args, "--total-env-steps", str(budget), "--quiet")
        return
    impactrl("train", *args, "--total-env-steps", str(budget), "--out", str(run_dir), "--quiet")


def evaluate(run_dir: Path, episodes: int) -> dict:
    """``impactrl eval RUN_DIR --episodes N``'s result, kept in ``RUN_DIR/evaluation.json`` until the
    run's latest checkpoint changes."""
    saved = run_dir / "evaluation.json"
    checkpoint = (run_dir / "checkpoints" / "latest.pt").resolve()
    if saved.exists() and saved.stat().st_mtime > checkpoint.stat().st_mtime:
        result = json.loads(saved.read_text())
        if result["episodes"] == episodes:
            return result
    print(f"+ impactrl eval {run_dir} --episodes {episodes}", flush=True)
    output = subprocess.run([sys.executable, "-m", "impactrl", "eval", str(run_dir), "--episodes", str(episodes)],
                            check=True, capture_output=True, text=True).stdout
    result_line = output.strip().splitlines()[-1]
    saved.write_text(result_line)
    return json.loads(result_line)


def final_return(records: list[dict], steps: int, task: str | None = None, y_key: str = "episode_return_mean"
                 ) -> float | None:
    """Mean of the logged ``y_key`` over the last ``LAST_FRACTION`` of ``steps`` (a task's own steps when given),
    or of the steps the run reached if it stopped earlier (``--stop-at-return``)."""
    xs, ys = curve(records, "env_steps", y_key, task)
    end = min(steps, records[-1]["env_steps"]) if records else steps
    window = [y for x, y in zip(xs, ys) if x >= (1 - LAST_FRACTION) * end]
    return float(np.mean(window)) if window else None


def time_to_return(records: list[dict], target: float, window: int = 3) -> float | None:
    """Wall-clock seconds until the mean of ``window`` consecutive logged returns first reaches ``target``."""
    xs, ys = curve(records, "wall_time_s", "episode_return_mean")
    for end in range(window, len(ys) + 1):
        if np.mean(ys[end - window:end]) >= target:
            return float(xs[end - 1])
    return None


def mean_std(values: list[float | None], digits: int = 2) -> str:
    """``mean ± std (n)`` of the values that exist, ``-`` if none."""
    present = [value for value in values if value is not None]
    if not present:
        return "-"
    text = f"{np.mean(present):.{digits}f} ± {np.std(present):.{digits}f}"
    return text if len(present) == len(values) else f"{text} ({len(present)} of {len(values)})"


def hundred_episode_means(records: list[dict]) -> list[tuple[int, float]]:
    """(env steps, mean return) over each run of consecutive metrics lines that holds at least
    ``EPISODES`` episodes, ending at every line: each line's mean weighted by its episode count."""
    lines = [(r["env_steps"], r["episodes"], r["episode_return_mean"]) for r in records if r["episodes"]]
    means = []
    for end in range(len(lines)):
        count, total, start = 0, 0.0, end
        while start >= 0 and count < EPISODES:
            count += lines[start][1]
            total += lines[start][1] * lines[start][2]
            start -= 1
        if count >= EPISODES:
            means.append((lines[end][0], total / count))
    return means


def compare(out: Path, env: str, variants: dict[str, list[str]], seeds: list[int], steps: int,
            title: str) -> list[str]:
    """Train every variant (its flags besides ``--env``, seed and budget) with every seed on ``env``;
    draw ``LABEL-steps.png`` and ``LABEL-time.png``; return the table rows: per variant the final
    return, wall time and policy lag (mean over the run's logs), each mean ± std over seeds, and
    the wall time to a common return, 90% of the lowest of the variants' mean final returns."""
    from impactrl.envs.tasks import task_labels

    label = task_labels([env])[0]
    runs = {(name, seed): out / f"{label}-{name}-s{seed}" for name in variants for seed in seeds}
    for (name, seed), run_dir in runs.items():
        train(run_dir, steps, [*variants[name], "--env", env, "--seed", str(seed), "--log-interval-s", "2"])
    for x, suffix in (("env_steps", "steps"), ("wall_time_s", "time")):
        impactrl("plot", *map(str, runs.values()), "--x", x, "--out", str(out / f"{label}-{suffix}.png"), "--title", title)
    records = {key: read_records(run_dir) for key, run_dir in runs.items()}
    finals = {key: final_return(value, steps) for key, value in records.items()}
    means = [np.mean([finals[name, seed] for seed in seeds if finals[name, seed] is not None] or [np.nan])
             for name in variants]
    target = 0.9 * float(np.nanmin(means))
    rows = []
    for name in variants:
        times = [time_to_return(records[name, seed], target) for seed in seeds]
        walls = [records[name, seed][-1]["wall_time_s"] for seed in seeds]
        lags = [float(np.mean(curve(records[name, seed], "env_steps", "policy_lag_mean")[1])) for seed in seeds]
        rows.append(f"| {label} | {name} | {mean_std([finals[name, seed] for seed in seeds])} | {mean_std(walls, 0)} | "
                    f"{mean_std(times, 0)} | {target:.2f} | {mean_std(lags, 1)} |")
    return rows


TABLE_HEADER = ["| env | variant | final return | wall time (s) | time to common return (s) | common return | policy lag |",
                "|---|---|---|---|---|---|---|"]


def write_table(out: Path, lines: list[str]) -> None:
    """``OUT/table.md`` from the table's lines, also printed."""
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    print(text)


def compare_algorithms(out: Path, envs: list[str], algos: list[str], seeds: list[int], steps: int,
                       flags: list[str]) -> None:
    """``compare`` the algorithms (each with ``flags``) on every env, into one table."""
    variants = {algo: ["--algo", algo, *flags] for algo in algos}
    lines = list(TABLE_HEADER)
    for env in envs:
        lines += compare(out, env, variants, seeds, steps, f"{env}: {','.join(algos)}, seeds {','.join(map(str, seeds))}")
    write_table(out, lines)
