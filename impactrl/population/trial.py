"""One member of the population: an impactrl run under Ray Tune (a class ``Trainable``).

Each ``step`` trains the run in its own run directory up to the next multiple of the perturbation
interval, in env steps, with the local runtime on the node Tune placed it on, and reports where it
got. ``save_checkpoint`` hands Tune the checkpoint that step ended with (everything a run's future
depends on: weights, optimiser, IMPACT's buffer and target, normalisers, PopArt); ``load_checkpoint``
makes the next step start from one, the trial's own after a restart or another trial's after an
exploit, with the trial's settings as they are now (``Learner.load_state_dict`` applies them to the
optimiser)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

import ray
from ray import tune

from impactrl.config import TrainConfig
from impactrl.rundir import create_run_dir, write_config

CHECKPOINT_FILE = "impactrl.pt"  # a Tune checkpoint: the run's checkpoint file
PROGRESS_FILE = "progress.json"  # and where that run had got
TRAINED_TO = "trained_to"  # a result's interval end in env steps: PBT's time
FROM_TUNE = "ckpt_from_tune"  # its copy in the run directory, resumed from


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """What every trial shares: the settings below the explored ones, where run directories go and
    how far a step trains."""

    base: TrainConfig  # what every trial starts from, its explored settings aside
    trials_dir: Path  # each trial's run directory is trials_dir/TRIAL_ID
    interval_env_steps: int


def trial_index(trial_id: str) -> int:
    """The trial's number in the experiment (Tune's ids end in it: ``1a2b3_00002``)."""
    return int(trial_id.rsplit("_", 1)[-1])


def segment_config(base: TrainConfig, explored: dict[str, Any], run_dir: Path, index: int,
                   until_env_steps: int) -> TrainConfig:
    """The run a step trains: the base with the trial's explored values, its own seed, and the budget
    cut at the step's end; the learning rate still anneals over the whole budget."""
    decay = base.lr_decay_env_steps if base.lr_decay_env_steps is not None else base.total_env_steps
    return dataclasses.replace(base, **explored, out=run_dir, seed=base.seed + index,
                               total_env_steps=until_env_steps, lr_decay_env_steps=decay)


def next_boundary(env_steps: int, interval: int, budget: int) -> int:
    """The next multiple of ``interval`` past ``env_steps``, at most ``budget``."""
    return min((env_steps // interval + 1) * interval, budget)


class ImpactrlTrial(tune.Trainable):
    def setup(self, config: dict[str, Any], plan: TrialPlan):
        self.plan = plan
        self.index = trial_index(self.trial_id)
        self.run_dir = Path(plan.trials_dir) / self.trial_id
        self.env_steps = 0
        self.start_from: Path | None = None  # a Tune checkpoint's file to start the next step from

    def step(self) -> dict[str, Any]:
        from impactrl.api import train

        base = self.plan.base
        until = next_boundary(self.env_steps, self.plan.interval_env_steps, base.total_env_steps)
        config = segment_config(base, self.config, self.run_dir, self.index, until)
        resume, checkpoint = self.prepare_run_dir(config)
        result = train(config=config, resume=resume, checkpoint=checkpoint, quiet=True,
                       invocation=["tune (trial)", self.trial_id, *(f"{k}={v!r}" for k, v in self.config.items())])
        self.env_steps, self.start_from = result.env_steps, None
        # PBT's clock is the interval's end, not env_steps: a run overshoots it by up to a batch, and
        # PBT would then find the next end less than an interval after the last and skip a comparison.
        return {TRAINED_TO: until, "env_steps": result.env_steps, "updates": result.updates, "episodes": result.episodes,
                # A trial with no finished episode yet ranks last (PBT needs a number).
                "episode_return_mean": -math.inf if result.return_mean is None else result.return_mean,
                "run_dir": str(self.run_dir), "node_id": ray.get_runtime_context().get_node_id()}

    def prepare_run_dir(self, config: TrainConfig) -> tuple[Path | None, str | None]:
        """(resume, checkpoint) for ``impactrl.train``: a fresh run, the run's newest checkpoint, or the
        Tune checkpoint ``load_checkpoint`` chose, copied in (the run directory made if this node lacks it)."""
        if self.start_from is None:
            return (self.run_dir, None) if (self.run_dir / "config.yaml").is_file() else (None, None)
        create_run_dir(self.run_dir)
        if not (self.run_dir / "config.yaml").is_file():
            write_config(self.run_dir, config)
        from impactrl.checkpoint import checkpoint_dir

        directory = checkpoint_dir(self.run_dir)
        directory.mkdir(exist_ok=True)
        shutil.copyfile(self.start_from, directory / f"{FROM_TUNE}.pt")
        (directory / f"{FROM_TUNE}.pt.sha256").unlink(missing_ok=True)
        return self.run_dir, FROM_TUNE

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        from impactrl.checkpoint import checkpoint_dir as run_checkpoints
        from impactrl.checkpoint import checkpoints_newest_first

        # The newest is the one the last step ended with: a run's final checkpoint.
        shutil.copyfile(checkpoints_newest_first(run_checkpoints(self.run_dir))[0], Path(checkpoint_dir) / CHECKPOINT_FILE)
        (Path(checkpoint_dir) / PROGRESS_FILE).write_text(json.dumps({"env_steps": self.env_steps}))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self.start_from = Path(checkpoint_dir) / CHECKPOINT_FILE
        self.env_steps = json.loads((Path(checkpoint_dir) / PROGRESS_FILE).read_text())["env_steps"]
