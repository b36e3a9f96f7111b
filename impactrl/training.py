"""Assemble a training run from a validated config and hand it to a runtime."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import sys
import threading
from pathlib import Path

import torch

from impactrl.algos import make_algorithm
from impactrl.build import make_agent, rollout_spec, run_tasks
from impactrl.config import TrainConfig
from impactrl.data.rollout import RolloutSpec
from impactrl.errors import ActorFailed, LearnerFailed, RunDirFailed, TrainingDiverged, UserError, run_dir_failed, stopped
from impactrl.metrics import MetricsWriter
from impactrl.models.torsos import learner_channels_last
from impactrl.runtime import get_runtime
from impactrl.runtime.learner import Learner, LearnerCounters
from impactrl.runtime.actor import ActorProgram, ENV_ACTORS


@contextlib.contextmanager
def process_settings_kept():
    """What a run changes for its whole process, put back when it returns or raises: torch's
    intra-op threads, the environment variables, and the handlers of the signals that stop a run.

    SIGTERM (a scheduler's stop) and SIGHUP (a closed terminal) stop the run like Ctrl-C: a
    checkpoint first, then exit. Background jobs of a non-interactive shell ignore SIGINT, so
    SIGTERM is how such runs are stopped; a SIGHUP already ignored (``nohup``) stays ignored and
    the run goes on. Only the main thread may set handlers (the Python API may be called from another)."""
    threads, environment, handlers = torch.get_num_threads(), dict(os.environ), {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
                handlers[signum] = signal.signal(signum, raise_interrupt)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for key in set(os.environ) - set(environment):
            del os.environ[key]
        os.environ.update(environment)


def raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def build_learner(config: TrainConfig, checkpoint: dict | None) -> tuple[Learner, RolloutSpec]:
    """The learner (restored from ``checkpoint`` if given) and the layout of one actor unroll."""
    torch.manual_seed(config.seed)
    tasks = run_tasks(config)
    agent = make_agent(config, tasks)
    spec = rollout_spec(config, agent, tasks)
    device = torch.device(config.device)
    agent.to(device)
    if device.type == "cpu":
        learner_channels_last(agent)
    learner = Learner(config, agent, make_algorithm(config, agent), device)
    if checkpoint is not None:
        try:
            learner.load_state_dict(checkpoint)
        except (RuntimeError, KeyError, ValueError, TypeError) as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise UserError(f"the checkpoint does not fit these settings: {reason}") from None
    return learner, spec


def start_wandb(config: TrainConfig, run_dir: Path):
    """A Weights & Biases run for ``run_dir`` (the same one again on --resume), offline unless
    WANDB_MODE says otherwise."""
    import wandb

    run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return wandb.init(project=config.wandb_project, dir=str(run_dir), id=run_id, resume="allow",
                      name=run_dir.name, config=dataclasses.asdict(config),
                      mode=os.environ.get("WANDB_MODE", "offline"))


def train(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, quiet: bool = False,
          program: ActorProgram = ENV_ACTORS) -> LearnerCounters:
    """Run ``config`` on its runtime, its actor processes running ``program`` (``impactrl bench
    --synthetic-actors`` gives its simulated actors)."""
    writer = MetricsWriter(run_dir, config.total_env_steps, terminal=None if quiet else sys.stdout,
                           wandb_run=start_wandb(config, run_dir) if config.wandb_project else None)
    finished = False
    try:
        counters = get_runtime(config.runtime).run(config, learner, spec, run_dir, writer, program)
        finished = True
        return counters
    except (KeyboardInterrupt, ActorFailed, LearnerFailed, TrainingDiverged, RunDirFailed) as error:
        # cli.main shows it on the terminal, once the bar is closed; train.log gets it if it still can
        with contextlib.suppress(RunDirFailed):
            writer.log_only(run_dir_failed(error) if isinstance(error, RunDirFailed) else stopped(error))
        raise
    finally:
        try:
            writer.close()
        except RunDirFailed:
            if finished:  # else the failure already on its way says more
                raise
