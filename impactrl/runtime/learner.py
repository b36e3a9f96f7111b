"""The learner loop: batches in, SGD steps, versioned weights out. Runtime-agnostic.

A runtime hands it two endpoints::

    source = BatchSource   (actors -> learner: the next batch of unrolls, with who made them)
    sink   = WeightSink    (learner -> actors: publish the weights with their version)

and the loop is::

    publish(weights, version = updates)
    until total_env_steps are consumed:
        if the algorithm wants data:
            batch = source.next_batch()      # idle time here is logged as time/learner_wait_fraction
            record policy lag (updates - behaviour version) and data age per unroll
            hand the batch to the algorithm (its env steps now count as consumed)
        one SGD step on algorithm.next_batch(), if it has one
        publish(weights, version = updates) when the algorithm says so
        every log interval: one metrics line; every checkpoint interval: a checkpoint
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch

from impactrl.algos.base import Algorithm, make_optimizer
from impactrl.checkpoint import restore_rng_states, rng_states, save_checkpoint
from impactrl.config import TrainConfig, to_yaml
from impactrl.data.rollout import Batch, DeviceTransfer
from impactrl.metrics import IntervalStats, MetricsWriter
from impactrl.models import Agent


class BatchSource(Protocol):
    def next_batch(self, timeout_s: float) -> tuple[Batch, dict[str, torch.Tensor]] | None:
        """A batch ``[T(+1), B, ...]`` and per-unroll metadata, or None after ``timeout_s``."""


class WeightSink(Protocol):
    def publish(self, agent: Agent, version: int) -> None:
        """Make the agent's current weights the newest ones actors load, tagged ``version``."""


@dataclass
class LearnerCounters:
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    wall_time_s: float = 0.0


class Learner:
    """Owns the agent's training state: optimiser, algorithm state, counters."""

    def __init__(self, config: TrainConfig, agent: Agent, algorithm: Algorithm, device: torch.device):
        self.config = config
        self.agent = agent
        self.algorithm = algorithm
        self.device = device
        self.to_device = DeviceTransfer(device)
        self.autocast = (functools.partial(torch.autocast, device.type, dtype=torch.bfloat16)
                         if config.learner_precision == "bfloat16" else contextlib.nullcontext)
        self.optimizer = make_optimizer(config, agent.parameters())
        self.counters = LearnerCounters()
        self._unseen_obs: list[torch.Tensor] = []

    def learning_rate(self) -> float:
        c = self.config
        if not c.lr_decay:
            return c.learning_rate
        return c.learning_rate * max(0.0, 1.0 - self.counters.env_steps / c.total_env_steps)

    def add(self, batch: Batch) -> None:
        """Hand a fresh batch from the actors to the algorithm; it counts as consumed env steps."""
        batch = self.to_device(batch)
        if self.agent.obs_norm is not None:
            self._unseen_obs.append(batch["obs"][:-1].flatten(0, 1))
        with self.autocast():
            self.algorithm.add_batch(batch)
        self.counters.env_steps += self.config.steps_per_batch

    def update(self) -> dict[str, float] | None:
        """One SGD step on the algorithm's next batch; None when it needs fresh data first."""
        with self.autocast():  # IMPACT's target network may score the batch it draws
            train_batch = self.algorithm.next_batch()
            if train_batch is None:
                return None
            loss, stats = self.algorithm.loss(train_batch)
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.agent.parameters(), self.config.grad_norm_clip, foreach=True)
        self.optimizer.step()
        self.counters.updates += 1
        stats.update(self.algorithm.after_update(self.counters.updates))
        if self._unseen_obs and self.algorithm.wants_data():
            # Observation statistics move only once the algorithm is done with its data, just
            # before the weights are published: the learner trains with the statistics the
            # actors used (PPO's first ratio is exactly 1), and both move together.
            self.agent.obs_norm.update(torch.cat(self._unseen_obs))
            self._unseen_obs.clear()
        stats["optim/grad_norm"] = float(grad_norm)
        stats["optim/learning_rate"] = self.optimizer.param_groups[0]["lr"]
        return stats

    def state_dict(self) -> dict:
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "algorithm": self.algorithm.state_dict(),
            "learner": asdict(self.counters),
            "rng": rng_states(),
            "config": to_yaml(self.config),
        }

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        self.counters = LearnerCounters(**state["learner"])
        restore_rng_states(state["rng"])


def run_learner(learner: Learner, source: BatchSource, weights: WeightSink, run_dir: Path,
                writer: MetricsWriter, check_health: Callable[[], None]) -> LearnerCounters:
    """Train until ``total_env_steps`` are consumed; see the module docstring."""
    config, counters = learner.config, learner.counters
    start = time.monotonic() - counters.wall_time_s
    interval = IntervalStats()
    last_log = last_checkpoint = time.monotonic()
    steps_at_last_log = counters.env_steps
    waited = trained = 0.0
    weights.publish(learner.agent, counters.updates)

    def log_line() -> None:
        nonlocal last_log, steps_at_last_log, waited, trained
        now = time.monotonic()
        counters.wall_time_s = now - start
        summary = interval.summary()
        counters.episodes += summary["episodes"]
        record = {
            "env_steps": counters.env_steps,
            "learner_updates": counters.updates,
            "wall_time_s": round(counters.wall_time_s, 3),
            "env_steps_per_s": (counters.env_steps - steps_at_last_log) / max(now - last_log, 1e-9),
            "episodes_total": counters.episodes,
            **summary,
            "time/learner_wait_fraction": waited / max(now - last_log, 1e-9),
            "time/learner_train_fraction": trained / max(now - last_log, 1e-9),
        }
        writer.write(record)
        interval.reset()
        last_log, steps_at_last_log, waited, trained = now, counters.env_steps, 0.0, 0.0

    def checkpoint() -> None:
        nonlocal last_checkpoint
        counters.wall_time_s = time.monotonic() - start
        save_checkpoint(run_dir, learner.state_dict(), f"ckpt_{counters.updates:010d}", config.keep_checkpoints)
        last_checkpoint = time.monotonic()

    try:
        deadline = math.inf if config.max_wall_time_s is None else time.monotonic() + config.max_wall_time_s
        # Past the step budget, finish the SGD steps owed to data already taken (PPO's epochs,
        # IMPALA's last batch) and stop when the algorithm would fetch more.
        while ((counters.env_steps < config.total_env_steps or not learner.algorithm.wants_data())
               and time.monotonic() < deadline):
            check_health()
            if learner.algorithm.wants_data():
                began = time.monotonic()
                item = source.next_batch(timeout_s=1.0)
                waited += time.monotonic() - began
                if item is None:
                    continue
                batch, meta = item
                ended = ~torch.isnan(batch["episode_return"])
                interval.add_episodes(batch["episode_return"][ended].numpy(), batch["episode_length"][ended].numpy())
                interval.add_unrolls(meta["actor_id"].numpy(), (counters.updates - meta["policy_version"]).numpy(),
                                     (time.time() - meta["created_at"]).numpy(), meta["stage_seconds"].numpy())
                learner.add(batch)
            began = time.monotonic()
            stats = learner.update()
            if stats is not None:
                interval.add(stats)
                if learner.algorithm.publish_now():
                    weights.publish(learner.agent, counters.updates)
            trained += time.monotonic() - began
            if time.monotonic() - last_log >= config.log_interval_s:
                log_line()
            if time.monotonic() - last_checkpoint >= config.checkpoint_interval_s:
                checkpoint()
    except BaseException:
        # Interrupted (Ctrl-C, a failed actor): keep what was learned so --resume can continue.
        checkpoint()
        raise
    log_line()
    checkpoint()
    return counters

