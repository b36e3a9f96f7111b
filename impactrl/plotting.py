"""``impactrl plot``: learning curves from one or more runs' ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from impactrl.errors import UserError


def read_curve(run_dir: Path, x_key: str, y_key: str) -> tuple[list[float], list[float]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise UserError(f"{run_dir} has no metrics.jsonl")
    xs, ys = [], []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get(y_key) is not None:
            xs.append(record[x_key])
            ys.append(record[y_key])
    return xs, ys


def plot_runs(run_dirs: Sequence[Path], out: Path, x_key: str = "env_steps",
              y_key: str = "episode_return_mean", title: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for run_dir in run_dirs:
        xs, ys = read_curve(run_dir, x_key, y_key)
        axes.plot(xs, ys, label=Path(run_dir).name, linewidth=1.4)
    axes.set_xlabel(x_key)
    axes.set_ylabel(y_key)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    if title:
        axes.set_title(title)
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return Path(out)
