"""The Python API: ``impactrl.train(env=..., algo=..., **settings)`` does what ``impactrl train`` does.

The same presets (env family, algorithm, algorithm for the family), the same checks before any
process starts, the same run directory (config.yaml, metrics, checkpoints, the lock). Settings are
the names ``impactrl train --help`` lists with ``_`` for ``-`` (``learning_rate=1e-3``), checked
like a ``--config`` file's. ``env`` has no default (a forgotten one would train the CLI's default,
CartPole, without a word); a resumed run keeps its own. Mistakes raise ``UserError`` (a
``ValueError``) with the CLI's one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Imported with the API: the ids registered by then are taken as ones every fresh process registers
# too (see check_where_actors_run; an id a script registers with its own class is probed anyway).
import impactrl.envs.factory  # noqa: F401
from impactrl.errors import UserError


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path  # config.yaml, metrics.jsonl, checkpoints/ (impactrl eval, plot, diagnose take it)
    env_steps: int
    updates: int  # learner updates (the policy version)
    episodes: int
    wall_time_s: float
    return_mean: float | None  # the mean training return of the last (up to) 100 episodes


def train(env: str | None = None, algo: str | None = None, *, resume: str | Path | None = None,
          checkpoint: str | None = None, quiet: bool = False, **settings) -> TrainResult:
    """Train like ``impactrl train --env ENV --algo ALGO --setting value ...``; ``env`` is required
    unless ``resume`` (a run directory) continues that run, as ``--resume`` (``checkpoint`` as
    ``--checkpoint``). ``quiet``: nothing on the terminal. Blocks until the run ends; Ctrl-C stops it
    with a checkpoint (KeyboardInterrupt)."""
    from impactrl.cli import resolve_train_config, run_train

    if env is None and resume is None:
        raise UserError('impactrl.train: env is required (a Gymnasium id, e.g. env="CartPole-v1"), '
                        "unless resume=RUN_DIR continues a run")

    argv = [*(["--resume", str(resume)] if resume is not None else []),
            *(["--checkpoint", checkpoint] if checkpoint is not None else []), *(["--quiet"] if quiet else [])]
    values = {"env": env, "algo": algo, **settings}
    values = {name: list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
              for name, value in values.items() if value is not None}
    request = resolve_train_config(argv, values, source="impactrl.train")
    run_dir, counters = run_train(request, ["train (impactrl.train)", *argv,
                                            *(f"{name}={value!r}" for name, value in values.items())])
    returns = counters.recent_returns
    return TrainResult(run_dir, counters.env_steps, counters.updates, counters.episodes, counters.wall_time_s,
                       float(np.mean(returns)) if returns else None)
