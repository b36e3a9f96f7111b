"""The one way into training: ``impactrl.train(env=..., algo=..., **settings)`` from Python, and what
``impactrl train`` calls once it has parsed its flags.

The same presets (env family, algorithm, algorithm for the family), the same checks before any
process starts, the same run directory (config.yaml, metrics, checkpoints, the lock). Settings are
the names ``impactrl train --help`` lists with ``_`` for ``-`` (``learning_rate=1e-3``), checked
like a ``--config`` file's. ``env`` has no default (a forgotten one would train the CLI's default,
CartPole, without a word); a resumed run keeps its own. Mistakes raise ``UserError`` (a
``ValueError``) with the CLI's one line.

The steps, each in its own module: ``config.resolve`` (where the settings come from),
``preflight`` (every check before anything starts), ``training`` (the learner, the process's
settings and signals while it runs, the runtime), ``rundir`` (the directory, its lock,
config.yaml and invocations.jsonl).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

# Imported with the API: the ids registered by then are taken as ones every fresh process registers
# too (see check_where_actors_run; an id a script registers with its own class is probed anyway).
import impactrl.envs.factory  # noqa: F401
from impactrl import training
from impactrl.config import TrainConfig
from impactrl.config.resolve import resolve
from impactrl.errors import UserError
from impactrl.preflight import check_checkpoint_choice, validate_train
from impactrl.rundir import prepared


@dataclass(frozen=True)
class TrainResult:
    run_dir: Path  # config.yaml, metrics.jsonl, checkpoints/ (impactrl eval, plot, diagnose take it)
    env_steps: int
    updates: int  # learner updates (the policy version)
    episodes: int
    wall_time_s: float
    return_mean: float | None  # the mean training return of the last (up to) 100 episodes


def train(env: str | None = None, algo: str | None = None, *, resume: str | Path | None = None,
          checkpoint: str | None = None, quiet: bool = False, config: TrainConfig | None = None,
          invocation: Sequence[str] | None = None, **settings) -> TrainResult:
    """Train like ``impactrl train --env ENV --algo ALGO --setting value ...``; ``env`` is required
    unless ``resume`` (a run directory) continues that run, as ``--resume`` (``checkpoint`` as
    ``--checkpoint``). ``quiet``: nothing on the terminal. Blocks until the run ends; Ctrl-C stops it
    with a checkpoint (KeyboardInterrupt).

    ``config``: a whole ``TrainConfig`` to train as it is, instead of ``env``, ``algo`` and settings
    (no presets; the checks all the same); ``impactrl train`` passes the one its flags resolved to.
    ``invocation``: the command ``invocations.jsonl`` records (default: this call)."""
    resume = Path(resume) if resume is not None else None
    flags = [*(["--resume", str(resume)] if resume is not None else []),
             *(["--checkpoint", checkpoint] if checkpoint is not None else []), *(["--quiet"] if quiet else [])]
    if config is None:
        config, given = resolved(env, algo, resume, checkpoint, settings)
    else:
        check_whole_config(config, env, algo, resume, settings)
        check_checkpoint_choice(resume, checkpoint)
        given = ["config=TrainConfig(...) (see config.yaml)"]
    run_dir, counters = run(config, resume, checkpoint, quiet,
                            invocation if invocation is not None else ["train (impactrl.train)", *flags, *given])
    returns = counters.recent_returns
    return TrainResult(run_dir, counters.env_steps, counters.updates, counters.episodes, counters.wall_time_s,
                       float(np.mean(returns)) if returns else None)


def resolved(env: str | None, algo: str | None, resume: Path | None, checkpoint: str | None,
             settings: dict[str, Any]) -> tuple[TrainConfig, list[str]]:
    """The config of ``env``, ``algo`` and the settings given (None for not given; checked like a
    ``--config`` file's) over the presets, and those as ``name=value`` for invocations.jsonl."""
    if env is None and resume is None:
        raise UserError('impactrl.train: env is required (a Gymnasium id, e.g. env="CartPole-v1"), '
                        "unless resume=RUN_DIR continues a run")
    check_checkpoint_choice(resume, checkpoint)
    values = {"env": env, "algo": algo, **settings}
    values = {name: list(value) if isinstance(value, tuple) else str(value) if isinstance(value, Path) else value
              for name, value in values.items() if value is not None}
    return (resolve(resume=resume, settings=values, source="impactrl.train"),
            [f"{name}={value!r}" for name, value in values.items()])


def check_whole_config(config: TrainConfig, env: str | None, algo: str | None, resume: Path | None,
                       settings: dict[str, Any]) -> None:
    """A ``config`` given to ``train`` is a TrainConfig, comes alone, and resumes the run in its ``out``."""
    if not isinstance(config, TrainConfig):
        raise UserError(f"impactrl.train: config must be a TrainConfig, got {type(config).__name__}")
    if env is not None or algo is not None or settings:
        raise UserError("impactrl.train: config is a whole TrainConfig; give it alone, or env, algo and settings "
                        "instead")
    if resume is not None and config.run_dir().resolve() != resume.resolve():
        raise UserError(f"impactrl.train: resume={str(resume)!r} but the config's out is {str(config.run_dir())!r}")


def run(config: TrainConfig, resume: Path | None, checkpoint_name: str | None, quiet: bool, invocation: Sequence[str]):
    """Check, then train ``config`` in its run directory; (run directory, final counters)."""
    checkpoint = validate_train(config, resume, checkpoint_name)
    with training.process_settings_kept():
        # Nothing is written before the learner is built and the checkpoint loaded into it: a
        # command that fails leaves the run directory as it found it.
        learner, spec = training.build_learner(config, checkpoint)
        with prepared(config, invocation, checkpoint) as run_dir:
            return run_dir, training.train(config, learner, spec, run_dir, quiet)
