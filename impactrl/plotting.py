"""``impactrl plot``: learning curves from one or more runs' ``metrics.jsonl`` (or curves kept as CSV).

Runs whose settings differ only in their seed (and directory) are one curve: the mean over the
seeds with the band from their lowest to their highest value, over the x range all of them
reached. Runs on several tasks get one panel per task: each task's return over its own env
steps (or the chosen x), with every single-task run on that task in the same panel for comparison.
"""

from __future__ import annotations

import csv
import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from impactrl.errors import UserError
from impactrl.metrics import read_metrics


def read_records(run_dir: Path) -> list[dict]:
    """A run directory's metrics lines, or the rows of a curve kept as CSV (``is_curve_file``)."""
    if is_curve_file(run_dir):
        return read_curve_file(Path(run_dir))
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise UserError(f"{run_dir} has no metrics.jsonl")
    # A line that is JSON but no object (null, a list) holds no metrics: left out, as a cut last line is.
    return [record for record in read_metrics(path) if isinstance(record, dict)]


def is_curve_file(path: Path) -> bool:
    """A CSV of metrics rows (a header of keys, a row per line), as experiments/ keep a run's curve
    in docs/curves: drawn beside runs, to compare a run with a published one."""
    return Path(path).suffix == ".csv"


def read_curve_file(path: Path) -> list[dict]:
    try:
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        return [{key: float(value) if value else None for key, value in row.items()} for row in rows]
    except (TypeError, ValueError):
        raise UserError(f"{path}: a curve CSV holds a header of metric names and rows of numbers") from None


def read_curve(run_dir: Path, x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    return curve(read_records(run_dir), x_key, y_key)


def curve(records: list[dict], x_key: str, y_key: str, task: str | None = None) -> tuple[list[float], list[float]]:
    """``(xs, ys)`` where ``y_key`` is set; of ``task``'s entry when given (its own env steps for x = env_steps)."""
    xs, ys = [], []
    for record in records:
        source = record.get("task", {}).get(task) if task is not None else record
        if source is None or source.get(y_key) is None:
            continue
        xs.append(source[x_key] if task is not None and x_key in source else record[x_key])
        ys.append(source[y_key])
    return xs, ys


def run_env(run_dir: Path) -> str | None:
    config = Path(run_dir) / "config.yaml"
    return yaml.safe_load(config.read_text()).get("env") if config.exists() else None


SEED_INDEPENDENT = ("seed", "out", "ray_address")  # settings that do not make runs differ in kind


def seed_groups(run_dirs: Sequence[Path]) -> list[list[Path]]:
    """The runs grouped by their settings besides ``SEED_INDEPENDENT``, in first-seen order. A setting
    missing from a config.yaml (one added to impactrl after the run began) counts as its default."""
    from impactrl.config import TrainConfig, renamed_settings, to_yaml

    defaults = yaml.safe_load(to_yaml(TrainConfig()))
    groups: dict[str, list[Path]] = {}
    for run_dir in map(Path, run_dirs):
        config = run_dir / "config.yaml"
        if config.exists():
            saved = {**defaults, **renamed_settings(yaml.safe_load(config.read_text()), str(config))}
            settings = {k: v for k, v in saved.items() if k not in SEED_INDEPENDENT}
            key = yaml.safe_dump(settings, sort_keys=True)
        else:
            key = str(run_dir)
        groups.setdefault(key, []).append(run_dir)
    return list(groups.values())


def group_label(run_dirs: Sequence[Path]) -> str:
    """A run's name; for several seeds their common name without its seed suffix, and the count."""
    names = [Path(run_dir).name.removesuffix(".csv") for run_dir in run_dirs]
    if len(names) == 1:
        return names[0]
    common = re.sub(r"[-_]?(s|seed)?$", "", os.path.commonprefix(names).rstrip("-_"))
    return f"{common or names[0]} ({len(names)} seeds)"


def mean_band(curves: Sequence[tuple[list[float], list[float]]], points: int = 200
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x, mean, lowest, highest)`` of curves interpolated onto ``points`` x values over the range
    every curve covers (one curve: itself)."""
    if len(curves) == 1:
        xs, ys = map(np.asarray, curves[0])
        return xs, ys, ys, ys
    low, high = max(xs[0] for xs, _ in curves), min(xs[-1] for xs, _ in curves)
    grid = np.linspace(low, high, points) if high > low else np.asarray([high])
    values = np.stack([np.interp(grid, xs, ys) for xs, ys in curves])
    return grid, values.mean(axis=0), values.min(axis=0), values.max(axis=0)


def trailing_mean(xs: Sequence[float], ys: Sequence[float], window: float) -> np.ndarray:
    """Each y replaced by the mean of the ys whose x lies in (x − ``window``, x]: a moving average
    over a span of the x axis, so runs logged at different intervals are smoothed alike."""
    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    starts = np.searchsorted(xs, xs - window, side="right")
    sums = np.concatenate([[0.0], np.cumsum(ys)])
    ends = np.arange(1, len(xs) + 1)
    return (sums[ends] - sums[starts]) / (ends - starts)


def plot_runs(run_dirs: Sequence[Path], out: Path, x_key: str = "env_steps",
              y_key: str = "episode_return_mean", title: str | None = None, each_run: bool = False,
              smooth: float | None = None) -> Path:
    """Draw the runs' ``y_key`` over ``x_key`` into ``out``; ``smooth``: each point the mean over
    that span of x before it (``trailing_mean``), applied to every run before seeds are averaged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    check_picture_format(out)
    runs = [(Path(run_dir), read_records(run_dir)) for run_dir in run_dirs]
    known = curve_keys([record for _, records in runs for record in records])
    for flag, key in (("--x", x_key), ("--y", y_key)):
        if key not in known:
            raise UserError(f"{flag} {key}: no such key in the runs' metrics ("
                            + (f"keys: {', '.join(sorted(known))})" if known else "they have no metrics lines yet)"))
    tasks = multi_task_labels(runs)
    panels = list(tasks) or [None]
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(7 if columns == 1 else 4.2 * columns, 4.5 if rows == 1 else 3.4 * rows),
                                dpi=110, squeeze=False)
    records_of = dict(runs)
    groups = [[run_dir] for run_dir, _ in runs] if each_run else seed_groups([run_dir for run_dir, _ in runs])
    for index, label in enumerate(panels):
        ax = axes[index // columns][index % columns]
        for group in groups:
            curves = panel_curves(group, records_of, label, tasks, x_key, y_key, smooth)
            if curves:
                xs, mean, lowest, highest = mean_band(curves)
                (line,) = ax.plot(xs, mean, label=group_label(group), linewidth=1.4)
                if len(curves) > 1:
                    ax.fill_between(xs, lowest, highest, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel(x_key + (" (of the task)" if label is not None and x_key == "env_steps" else ""))
        ax.set_ylabel(y_key)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
        if label is not None:
            ax.set_title(label, fontsize=10)
    for index in range(len(panels), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    return save_figure(figure, out, title)


def save_figure(figure, out: Path, title: str | None) -> Path:
    import matplotlib.pyplot as plt

    if title:
        figure.suptitle(title)
    figure.tight_layout()
    try:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(out)
    except OSError as error:
        raise UserError(f"--out {out}: cannot write it ({error.strerror or error})") from None
    finally:
        plt.close(figure)
    return Path(out)


def plot_population(experiment: Path, out: Path, x_key: str = "env_steps", y_key: str = "episode_return_mean",
                    title: str | None = None) -> Path:
    """An ``impactrl tune`` experiment: each trial's results at the end of each interval (by default
    the mean return of its last 100 episodes, what PBT ranks), thin, and the best trial's lineage
    over them, thick: the training its final agent carries, trial by trial across the exploits."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from impactrl.population.record import best_trial, interval_results, lineage, read_exploits

    check_picture_format(out)
    results = interval_results(experiment)
    if not results:
        raise UserError(f"{experiment}: no trial has reported a result yet")
    known = curve_keys([line for lines in results.values() for line in lines])
    for flag, key in (("--x", x_key), ("--y", y_key)):
        if key not in known:
            raise UserError(f"{flag} {key}: no such key in the trials' results (keys: {', '.join(sorted(known))})")
    curves = {trial: (np.array([line[x_key] for line in lines], dtype=float),
                      np.array([line[y_key] if line[y_key] is not None else np.nan for line in lines], dtype=float))
              for trial, lines in sorted(results.items())}
    figure, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for trial, (xs, ys) in curves.items():
        ax.plot(xs, ys, linewidth=0.9, alpha=0.7, marker=".", markersize=3, label=trial)
    best = best_trial(experiment) or max(curves, key=lambda trial: np.nan_to_num(curves[trial][1][-1], nan=-np.inf))
    spans = lineage(best, read_exploits(experiment))
    steps = {trial: np.array([line["env_steps"] for line in lines]) for trial, lines in results.items()}
    xs_best, ys_best = [], []
    for index, span in enumerate(spans):
        end = spans[index + 1]["from_env_steps"] if index + 1 < len(spans) else np.inf
        xs, ys = curves[span["trial"]]
        taken = steps[span["trial"]]
        inside = ((taken > span["from_env_steps"]) if index else (taken >= 0)) & (taken <= end)
        xs_best += list(xs[inside])
        ys_best += list(ys[inside])
    ax.plot(xs_best, ys_best, color="black", linewidth=2.2, label=f"best lineage (ends in {best})")
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key + (" (last 100 episodes)" if y_key == "episode_return_mean" else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(figure, out, title)


def check_picture_format(out: Path) -> None:
    """UserError unless matplotlib can write the format ``out``'s suffix names (PNG without one)."""
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = Path(out).suffix[1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise UserError(f"--out {out}: cannot write a .{suffix} picture (formats: {', '.join(sorted(formats))})")


def multi_task_labels(runs: list[tuple[Path, list[dict]]]) -> dict[str, str]:
    """Task label -> env id, over the multi-task runs among ``runs`` (run directory, records)."""
    tasks: dict[str, str] = {}
    for run_dir, records in runs:
        if records and "task" in records[-1]:
            from impactrl.envs.tasks import task_ids, task_labels

            ids = task_ids(run_env(run_dir))
            tasks.update(zip(task_labels(ids), ids))
    return tasks


def panel_curves(group: list[Path], records_of: dict[Path, list[dict]], label: str | None, tasks: dict[str, str],
                 x_key: str, y_key: str, smooth: float | None) -> list[tuple[list, Sequence[float]]]:
    """The curves of a group of runs in the panel of task ``label`` (None: the only panel): a
    multi-task run's curve of that task, a single-task run's own curve where it played that task."""
    curves = []
    for run_dir in group:
        records = records_of[run_dir]
        multi = bool(records) and "task" in records[-1]
        if label is not None and multi:
            xs, ys = curve(records, x_key, y_key, label)
        elif label is None or run_env(run_dir) == tasks[label]:
            xs, ys = curve(records, x_key, y_key)
        else:
            continue
        if xs:
            curves.append((xs, trailing_mean(xs, ys, smooth) if smooth else ys))
    return curves


def curve_keys(records: list[dict]) -> set[str]:
    """The keys a curve can be drawn from: the records' numbers (null where not measured), and their tasks'."""
    entries = [*records, *(entry for record in records for entry in record.get("task", {}).values())]
    return {key for entry in entries for key, value in entry.items() if value is None or isinstance(value, (int, float))}
