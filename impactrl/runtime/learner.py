"""The learner loop: batches in, SGD steps, versioned weights out. Runtime-agnostic.

A runtime hands it two endpoints::

    source = BatchSource   (actors -> learner: the next batch of unrolls, with who made them)
    sink   = WeightSink    (learner -> actors: publish the weights with their version)

and the loop is::

    publish(weights, version = updates)
    until total_env_steps are consumed and trained on, max_wall_time_s has passed, or the mean
    return of the last 100 episodes reaches stop_at_return:                    (StopConditions)
        while the budget lasts, if the algorithm wants data (or takes a batch   (intake)
        that is ready now, IMPACT --buffer-fetch ready):
            batch = source.next_batch()      # its wait: time/learner_receive_fraction
            record policy lag (updates - behaviour version) and data age per unroll; with   (take)
                max_policy_lag, drop the unrolls older than that
            hand the batch to the algorithm (its env steps now count as consumed)
        one SGD step on algorithm.next_batch(), if it has one (skipped on the device   (train)
            if its loss or gradient is not finite), with no host sync
        publish(weights, version = updates) when the algorithm says so, at most every
            publish_interval updates
        every log interval: one metrics line, checked by the diagnostic rules   (Telemetry)
            (max_skipped_updates skipped steps in a row stop the run)
        every checkpoint interval: a checkpoint                                  (Checkpointer)

The learner thread owns every counter: what other threads see (the collector's actor restarts
and the env errors of failed actors) reaches it through ``CounterInbox``, which the loop empties
at each step. Runtimes get ``Learner.link()``: the values and calls their actor side needs.

With ``--num-learners N`` every learner runs this loop in lockstep, each on its share of every
batch (``runtime/lockstep.py``: one agreement per round), and the SGD step reduces their
gradients (``Learner.update``; runtime/distributed.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from impactrl.algos import make_algorithm
from impactrl.algos.base import Algorithm, LossExtras, load_optimizer_state, make_optimizer
from impactrl.checkpoint import checkpoint_dir, restore_rng_states, rng_states, save_checkpoint
from impactrl.config import TrainConfig, to_yaml
from impactrl.data.rollout import REWARD_STATS_SIZE, Batch, keep_unrolls, restack_frames, to_device
from impactrl.diagnostics import LiveDiagnostics
from impactrl.envs.tasks import reward_threshold, task_ids, task_labels
from impactrl.errors import RunDirFailed, TrainingDiverged
from impactrl.metrics import IntervalStats, MetricsWriter
from impactrl.models import DEAD_UNIT_SAMPLE, Agent
from impactrl.runtime.distributed import LearnerGroup


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
    actor_restarts: int = 0
    actor_restarts_by_id: dict[str, int] = field(default_factory=dict)
    env_errors: int = 0
    updates_skipped: int = 0
    unrolls_dropped: int = 0
    env_steps_by_task: dict[str, int] = field(default_factory=dict)  # several tasks: env steps consumed per task
    recent_returns: list[float] = field(default_factory=list)  # the last RETURN_WINDOW episodes' returns


# Where the learner thread's time goes: waiting for a batch (the collector thread assembles them
# beside its steps), moving batches to the device (and rebuilding stacked frames), the
# algorithm's work (SGD steps), publishing weights.
LEARNER_STAGES = ("receive", "transfer", "train", "publish")

RETURN_WINDOW = 100  # episodes averaged for --stop-at-return: Gymnasium's "solved" convention


class SkippedUpdates:
    """The SGD steps skipped for a non-finite loss or gradient, counted on the device at each step
    (``record``, no sync) and read into the counters at each metrics line and checkpoint (``read``)."""

    def __init__(self) -> None:
        self._since_read: torch.Tensor | None = None
        self._in_a_row: torch.Tensor | None = None
        self._last: tuple[torch.Tensor, torch.Tensor, Batch] | None = None
        self.in_a_row = 0  # as of the last read

    def record(self, taken: torch.Tensor, loss: torch.Tensor, grad_norm: torch.Tensor, batch: Batch) -> None:
        skipped = (~taken).long()
        self._since_read = skipped if self._since_read is None else self._since_read + skipped
        self._in_a_row = skipped if self._in_a_row is None else (self._in_a_row + 1) * skipped
        self._last = (loss, grad_norm, batch)

    def read(self, counters: LearnerCounters) -> None:
        """Add the skips since the last read to ``counters.updates_skipped`` (one transfer)."""
        if self._since_read is None:
            return
        since_read, self.in_a_row = torch.stack([self._since_read, self._in_a_row]).tolist()
        counters.updates_skipped += since_read
        self._since_read = None

    def last(self) -> tuple[float, float, Batch]:
        """The last step's loss, gradient norm and batch: what a divergence is reported with."""
        loss, grad_norm, batch = self._last
        return float(loss), float(grad_norm), batch


class CounterInbox:
    """Counts that threads other than the learner's report (the collector's actor restarts, the
    env errors of actors that failed), added to the counters by the learner thread alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._restarts: list[int] = []
        self._env_errors = 0

    def restart(self, actor_id: int) -> None:
        with self._lock:
            self._restarts.append(actor_id)

    def env_errors(self, count: int) -> None:
        with self._lock:
            self._env_errors += count

    def apply_to(self, counters: LearnerCounters) -> None:
        """On the learner thread: add what came since the last call."""
        with self._lock:
            restarts, self._restarts = self._restarts, []
            env_errors, self._env_errors = self._env_errors, 0
        counters.env_errors += env_errors
        for actor_id in restarts:
            counters.actor_restarts += 1
            counters.actor_restarts_by_id[str(actor_id)] = counters.actor_restarts_by_id.get(str(actor_id), 0) + 1


@dataclass(frozen=True)
class LearnerLink:
    """What a runtime's actor side needs of the learner, safe to use from the collector thread."""

    device: torch.device  # where batches go (pinned host memory for CUDA)
    rank: int  # the learner's, with several learners (0 alone)
    updates: Callable[[], int]  # the policy version now: a new actor process's seed generation is past it
    reward_stats_of: Callable[[int], np.ndarray | None]  # an actor's reward normalisers, for its restart
    inbox: CounterInbox  # where the actor side reports restarts and env errors


class Learner:
    """Owns the agent's training state: optimiser, algorithm state, counters."""

    def __init__(self, config: TrainConfig, agent: Agent, algorithm: Algorithm, device: torch.device):
        self.config = config
        self.learn = True  # False (impactrl bench --no-learning): batches are taken, versions advance, no SGD
        self.agent = agent
        self.algorithm = algorithm
        self.device = device
        self.autocast = (functools.partial(torch.autocast, device.type, dtype=torch.bfloat16)
                         if config.learner_precision == "bfloat16" else contextlib.nullcontext)
        self.optimizer = make_optimizer(config, agent.parameters())
        self.first_layer = next(agent.torso.parameters())
        self.counters = LearnerCounters()
        self.inbox = CounterInbox()
        self.group = LearnerGroup()  # alone until join
        self._unseen_obs: list[torch.Tensor] = []
        self.skips = SkippedUpdates()
        self.taken: torch.Tensor | None = None  # whether the last SGD step was applied (on the device)
        self.wall_time_progress = 0.0  # the share of max_wall_time_s spent in this invocation
        self.stage_seconds = dict.fromkeys(LEARNER_STAGES, 0.0)  # since the last metrics line
        # Each actor's envs' reward normalisers as of its last consumed unroll: saved in
        # checkpoints and handed to a restarted or resumed actor.
        self.reward_stats = (torch.full((config.num_actors, config.envs_per_actor, REWARD_STATS_SIZE), float("nan"),
                                        dtype=torch.float64) if config.normalize_rewards else None)

    def join(self, group: LearnerGroup) -> None:
        """Train as one of ``group``'s learners (their gradients and statistics reduced together)."""
        self.group = self.algorithm.group = group

    def reward_stats_of(self, actor_id: int) -> np.ndarray | None:
        if self.reward_stats is None or actor_id >= len(self.reward_stats):
            return None
        return self.reward_stats[actor_id].numpy().copy()

    def link(self) -> LearnerLink:
        return LearnerLink(self.device, self.group.rank, lambda: self.counters.updates, self.reward_stats_of, self.inbox)

    def record_unrolls(self, meta: dict[str, torch.Tensor]) -> None:
        """Take in what actors reported with a batch's unrolls: env faults, reward normalisers."""
        self.counters.env_errors += int(meta["env_errors"].sum())
        if self.reward_stats is not None and "reward_stats" in meta:
            for actor_id, stats in zip(meta["slot_actor_id"].tolist(), meta["reward_stats"]):  # in commit order
                self.reward_stats[actor_id] = stats

    def learning_rate(self) -> float:
        """Annealed linearly to 0 over lr_decay_env_steps if given, else over the step budget or
        max_wall_time_s, whichever ends first."""
        c = self.config
        if not c.lr_decay:
            return c.learning_rate
        if c.lr_decay_env_steps is not None:
            progress = self.counters.env_steps / c.lr_decay_env_steps
        else:
            progress = max(self.counters.env_steps / c.total_env_steps, self.wall_time_progress)
        return c.learning_rate * max(0.0, 1.0 - progress)

    def add(self, batch: Batch) -> Batch:
        """Hand a fresh batch from the actors to the algorithm (on the device, with its stacked
        frames rebuilt); it counts as consumed env steps. Returns the batch as handed over."""
        began = time.perf_counter()
        batch = restack_frames(to_device(batch, self.device))
        moved = time.perf_counter()
        if self.agent.obs_norm is not None and self.learn:  # the statistics learn too: --no-learning freezes them
            self._unseen_obs.append(batch["obs"][:-1].flatten(0, 1))
        with self.autocast():
            self.algorithm.add_batch(batch)
        # Every learner takes an equal share of each batch at the same step: the count is global.
        self.counters.env_steps += batch["reward"].numel() * self.group.size
        self.stage_seconds["transfer"] += moved - began
        self.stage_seconds["train"] += time.perf_counter() - moved
        return batch

    def dead_units(self, obs: torch.Tensor) -> dict[str, float]:
        """The torso's dead ReLU units (``dead_unit_fractions``) on observations ``[N, ...]``, the
        last ``DEAD_UNIT_SAMPLE`` of them: the first layer and the worst."""
        fractions = self.agent.dead_unit_fractions(obs[-DEAD_UNIT_SAMPLE:].to(self.device))
        if not fractions:
            return {}
        return {"torso/dead_units_first_layer": fractions[0], "torso/dead_units_worst_layer": max(fractions)}

    def update(self) -> dict[str, torch.Tensor | float] | None:
        """One SGD step on the algorithm's next batch; None when it needs fresh data first.

        Nothing here reads the device from the host, so on a GPU the next step is queued while
        this one runs: the statistics stay on the device (``IntervalStats`` reads them once per
        metrics line), and a non-finite loss or gradient skips the step on the device too, the
        optimiser told by ``found_inf`` (``make_optimizer``). ``taken`` (a 0-dim bool) says
        whether the step was applied; ``check_diverged`` counts the skips at each metrics line."""
        with self.autocast():  # IMPACT's target network may score the batch it draws
            train_batch = self.algorithm.next_batch()
            if train_batch is None:
                return None
            if not self.learn:
                self.counters.updates += 1
                self.taken = None
                return {}
            loss, stats, extras = self.algorithm.loss(train_batch)
        stats = {key: value.detach() if isinstance(value, torch.Tensor) else value for key, value in stats.items()}
        learning_rate = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        loss, extras = self._reduce(loss.detach(), extras)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.agent.parameters(), self.config.grad_norm_clip, foreach=True)
        self.taken = taken = torch.isfinite(loss) & torch.isfinite(grad_norm)
        self.optimizer.found_inf = (~taken).float()
        first_layer_before = self.first_layer.detach().clone()
        self.optimizer.step()
        self.counters.updates += 1  # SGD steps, skipped ones included: the host does not know which
        self.skips.record(taken, loss, grad_norm, train_batch)
        stats.update(self.algorithm.after_update(self.counters.updates, extras, taken))
        stats.update({
            # Where dying ReLUs start: the first layer's step against its size.
            "optim/first_layer_update_ratio": ((self.first_layer.detach() - first_layer_before).norm()
                                               / first_layer_before.norm().clamp_min(1e-12)),
            "optim/grad_norm": grad_norm,
            "optim/learning_rate": learning_rate,
        })
        if self._unseen_obs and self.algorithm.wants_data():
            # Observation statistics move only once the algorithm is done with its data, just
            # before the weights are published: the learner trains with the statistics the
            # actors used (PPO's first ratio is exactly 1), and both move together.
            self.agent.obs_norm.update(torch.cat(self._unseen_obs), reduce=self.group.sum)
            self._unseen_obs.clear()
        return stats

    def _reduce(self, loss: torch.Tensor, extras: LossExtras) -> tuple[torch.Tensor, LossExtras]:
        """The gradients reduced over the learners as the loss reduces over the batch, with the
        loss and IMPACT's KL averaged in the same all-reduce: every learner then clips, skips or
        steps, and adapts the KL coefficient, alike. Alone, nothing changes."""
        if self.group.size == 1:
            return loss, extras
        kl = extras.kl.float() if extras.kl is not None else loss.new_zeros((), dtype=torch.float32)
        scalars = torch.stack([loss.float(), kl])
        parameters = [p for p in self.agent.parameters() if p.grad is not None]
        loss, kl = self.group.reduce_gradients(parameters, scalars, self.algorithm.loss_reduction == "mean")
        return loss, extras if extras.kl is None else dataclasses.replace(extras, kl=kl)

    def check_diverged(self) -> None:
        """Raise ``TrainingDiverged`` once ``max_skipped_updates`` steps in a row were skipped
        (read from the device: called at each metrics line, so the run stops up to one interval
        late, its weights as before the first skip)."""
        self.skips.read(self.counters)
        if self.skips.in_a_row < self.config.max_skipped_updates:
            return
        loss, grad_norm, batch = self.skips.last()
        bad_inputs = [key for key, value in batch.items() if key != "episode_return"  # NaN but where a game ended
                      and value.is_floating_point() and not torch.isfinite(value).all()]
        found = (f"; the last batch held non-finite values in {', '.join(bad_inputs)}: check the env"
                 if bad_inputs else "")
        raise TrainingDiverged(
            f"{self.skips.in_a_row} learner updates in a row had a non-finite loss or gradient (last: loss "
            f"{loss}, gradient norm {grad_norm}) and were skipped{found} (--max-skipped-updates "
            f"{self.config.max_skipped_updates}). The checkpoint holds the weights from before the first of them. "
            "Lower --learning-rate, lower --grad-norm-clip, or scale the rewards (--reward-clip abs_one, "
            "--normalize-rewards)")

    def state_dict(self) -> dict:
        """Everything the run's future depends on, as tensors and plain types (``weights_only`` loads it)."""
        self.skips.read(self.counters)
        return {
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "algorithm": self.algorithm.state_dict(),
            "learner": asdict(self.counters),
            "unseen_obs": list(self._unseen_obs),
            "reward_stats": self.reward_stats,
            "rng": rng_states(),
            "config": to_yaml(self.config),
        }

    @staticmethod
    def local_part(state: dict, algorithm: Algorithm) -> dict:
        """What of a learner's ``state_dict`` is its own with several learners: the algorithm's data
        (``Algorithm.local_state_keys``), the observations it has not absorbed, its actors' reward
        normalisers and its RNG states. The rest is the same on every learner."""
        return {"algorithm": {key: state["algorithm"][key] for key in algorithm.local_state_keys},
                **{key: state[key] for key in ("unseen_obs", "reward_stats", "rng")}}

    def load_local_part(self, part: dict) -> None:
        """Replace this learner's own state by ``part`` (``local_part`` of a checkpoint it wrote)."""
        state = self.state_dict()
        state["algorithm"].update(part["algorithm"])
        self.load_state_dict({**state, **{key: value for key, value in part.items() if key != "algorithm"}})

    def drop_local_data(self) -> None:
        """Start without held data (a pending batch, IMPACT's buffer, PPO's batch, unabsorbed
        observations), as a fresh learner: what a resume does when a learner's part is missing."""
        fresh = make_algorithm(self.config, self.agent).state_dict()
        self.load_local_part({**self.local_part(self.state_dict(), self.algorithm), "unseen_obs": [],
                              "algorithm": {key: fresh[key] for key in self.algorithm.local_state_keys}})

    def load_state_dict(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        load_optimizer_state(self.optimizer, state["optimizer"], self.config)
        self.algorithm.load_state_dict(state["algorithm"])
        self.counters = LearnerCounters(**state["learner"])
        self._unseen_obs = [obs.to(self.device) for obs in state["unseen_obs"]]
        saved = state["reward_stats"]
        if self.reward_stats is not None and saved is not None:
            # The actor count may differ on resume: actors beyond the saved ones start afresh.
            shared = min(len(saved), len(self.reward_stats))
            self.reward_stats[:shared] = saved[:shared]
        restore_rng_states(state["rng"])


class FrameSample:
    """The newest ``size`` (or up to one batch more) observations, one per unroll of each batch,
    from a different time step of each: a batch's own frames are consecutive and alike, and a dead-unit
    count on them alone read units dead that fired on other frames."""

    def __init__(self, size: int):
        self.size = size
        self.batches: collections.deque[torch.Tensor] = collections.deque()
        self.count = 0
        self.added = 0

    def add(self, obs: torch.Tensor) -> None:
        """One batch's observations ``[T, B, ...]``: keeps ``B`` of them, a copy so the batch can be freed."""
        self.batches.append(obs[self.added % obs.shape[0]].clone())
        self.added += 1
        self.count += len(self.batches[-1])
        while self.count - len(self.batches[0]) >= self.size:
            self.count -= len(self.batches.popleft())

    def full(self) -> bool:
        return self.count >= self.size

    def frames(self) -> torch.Tensor:
        """``[N, ...]``, oldest first."""
        return torch.cat(tuple(self.batches))


class Telemetry:
    """What the loop measured since the last metrics line, and writing that line: per-interval
    statistics, the live diagnostics, the learner's time per stage and the env-step rate."""

    def __init__(self, learner: Learner, writer: MetricsWriter, start: float):
        config = learner.config
        self.learner, self.writer, self.start = learner, writer, start
        ids = task_ids(config.env)
        self.labels = task_labels(ids) if len(ids) > 1 else None
        self.interval = IntervalStats(config.envs_per_actor * config.unroll_length, self.labels)
        self.diagnostics = LiveDiagnostics(config, reward_threshold(config.env))
        self.last_line = time.monotonic()
        # Steps/s count from the first batch: the actors' start-up would make the first rate look tiny.
        self.rate_since: float | None = None
        self.steps_at_rate_start = learner.counters.env_steps
        self.dead_unit_frames = FrameSample(DEAD_UNIT_SAMPLE)

    def unrolls(self, batch: Batch, meta: dict[str, torch.Tensor], lags: torch.Tensor) -> None:
        """A batch the algorithm takes (after the lag filter): its episodes, lags, ages, actors' time."""
        counters, config = self.learner.counters, self.learner.config
        ended = ~torch.isnan(batch["episode_return"])
        tasks = batch["task"][0]  # [B]: an unroll plays one task
        self.interval.add_episodes(batch["episode_return"][ended].numpy(), batch["episode_length"][ended].numpy(),
                                   batch["task"][:-1][ended].numpy())
        counters.recent_returns = (counters.recent_returns + batch["episode_return"][ended].tolist())[-RETURN_WINDOW:]
        self.interval.add_unrolls(meta["actor_id"].numpy(), lags.numpy(), (time.time() - meta["created_at"]).numpy(),
                                  meta["stage_seconds"].numpy(), tasks.numpy())
        if self.labels is not None:
            for task, count in enumerate(torch.bincount(tasks, minlength=len(self.labels)).tolist()):
                label = self.labels[task]
                counters.env_steps_by_task[label] = counters.env_steps_by_task.get(label, 0) + count * config.unroll_length
        self.interval.add({"reward/batch_abs_max": float(batch["reward"].abs().max())})

    def consumed(self, obs: torch.Tensor) -> None:
        """A batch was handed to the algorithm; ``obs`` ``[T, B, ...]`` as it saw them."""
        self.dead_unit_frames.add(obs)
        if self.rate_since is None:
            self.rate_since, self.steps_at_rate_start = time.monotonic(), self.learner.counters.env_steps

    def due(self) -> bool:
        return time.monotonic() - self.last_line >= self.learner.config.log_interval_s

    def write(self) -> None:
        """One metrics line, checked by the diagnostic rules (their warnings go to the terminal)."""
        learner, counters = self.learner, self.learner.counters
        now = time.monotonic()
        counters.wall_time_s = now - self.start
        learner.skips.read(counters)
        summary = self.interval.summary()
        counters.episodes += summary["episodes"]
        elapsed = max(now - self.last_line, 1e-9)
        stages = learner.stage_seconds
        record = {
            "env_steps": counters.env_steps,
            "learner_updates": counters.updates,
            "wall_time_s": round(counters.wall_time_s, 3),
            # null until a rate can be measured: from the first batch, over at least 0.1 s
            "env_steps_per_s": ((counters.env_steps - self.steps_at_rate_start) / (now - self.rate_since)
                                if self.rate_since is not None and now - self.rate_since >= 0.1 else None),
            "episodes_total": counters.episodes,
            "actor_restarts": counters.actor_restarts,
            "env_errors": counters.env_errors,
            "updates_skipped": counters.updates_skipped,
            "unrolls_dropped": counters.unrolls_dropped,
            **summary,
            "time/learner_wait_fraction": stages["receive"] / elapsed,
            **{f"time/learner_{stage}_fraction": seconds / elapsed for stage, seconds in stages.items()},
        }
        if self.dead_unit_frames.full():
            record.update(learner.dead_units(self.dead_unit_frames.frames()))
        for actor_id, restarts in counters.actor_restarts_by_id.items():
            record.setdefault("actor", {}).setdefault(actor_id, {})["restarts"] = restarts
        for label, steps in counters.env_steps_by_task.items():
            record["task"][label]["env_steps"] = steps
        findings = self.diagnostics.check(record)
        if findings:
            record["diagnostics"] = [finding.record() for finding in findings]
        self.writer.write(record)
        for finding in findings:
            self.writer.warn(finding.text())
        self.interval.reset()
        if record["env_steps_per_s"] is not None:
            self.rate_since, self.steps_at_rate_start = now, counters.env_steps
        self.last_line = now
        stages.update(dict.fromkeys(stages, 0.0))


class Checkpointer:
    """A checkpoint every ``checkpoint_interval_s``, and on demand (the end, an interruption).
    Learner 0 writes the run's checkpoints; with several learners each other one writes its own
    state beside them (``learner_part_dir``), under the same name."""

    def __init__(self, learner: Learner, run_dir: Path, start: float):
        self.learner, self.run_dir, self.start = learner, run_dir, start
        rank = learner.group.rank
        self.directory = None if rank == 0 else learner_part_dir(run_dir, rank)
        self.last = time.monotonic()
        self.next_milestone = self.milestone_after(learner.counters.env_steps)

    def milestone_after(self, env_steps: int) -> float:
        """The first multiple of ``milestone_env_steps`` past ``env_steps`` (infinity without milestones)."""
        every = self.learner.config.milestone_env_steps
        return math.inf if every is None else (env_steps // every + 1) * every

    def due(self) -> bool:
        return (time.monotonic() - self.last >= self.learner.config.checkpoint_interval_s
                or self.learner.counters.env_steps >= self.next_milestone)

    def save(self) -> None:
        counters, config = self.learner.counters, self.learner.config
        counters.wall_time_s = time.monotonic() - self.start
        milestone = None
        if counters.env_steps >= self.next_milestone:
            milestone = f"steps_{self.next_milestone:012d}"
            self.next_milestone = self.milestone_after(counters.env_steps)
        save_checkpoint(self.run_dir, self.learner.state_dict(), checkpoint_name(counters.updates),
                        config.keep_checkpoints, self.directory, milestone)
        self.last = time.monotonic()


def checkpoint_name(updates: int) -> str:
    return f"ckpt_{updates:010d}"


def learner_part_dir(run_dir: Path, rank: int) -> Path:
    """Where learner ``rank`` (> 0) keeps its own part of each checkpoint (its buffer, its actors' normalisers)."""
    return checkpoint_dir(run_dir) / f"learner-{rank}"


class StopConditions:
    """When training ends: the step budget spent (once the algorithm has trained on the data it
    took: PPO's epochs, IMPALA's last batch, the uses left in IMPACT's buffer), ``max_wall_time_s``
    passed, or the mean return of the last RETURN_WINDOW episodes at ``stop_at_return``."""

    def __init__(self, learner: Learner):
        self.learner = learner
        limit = learner.config.max_wall_time_s
        self.deadline = math.inf if limit is None else time.monotonic() + limit

    def budget_left(self) -> bool:
        return self.learner.counters.env_steps < self.learner.config.total_env_steps

    def return_reached(self) -> bool:
        config, returns = self.learner.config, self.learner.counters.recent_returns
        return (config.stop_at_return is not None and len(returns) == RETURN_WINDOW
                and float(np.mean(returns)) >= config.stop_at_return)

    def wall_time_progress(self) -> float:
        """The share of ``max_wall_time_s`` spent (0 without one): where the learning-rate schedule is."""
        limit = self.learner.config.max_wall_time_s
        return 0.0 if limit is None else 1.0 - (self.deadline - time.monotonic()) / limit

    def reached(self) -> bool:
        return ((not self.budget_left() and not self.learner.algorithm.owes_updates())
                or time.monotonic() >= self.deadline or self.return_reached())


class LearnerLoop:
    """The learner loop of the module docstring, for one learner: ``step()`` reads top to bottom.
    (Several learners run ``runtime/lockstep.py``'s subclass, which agrees on each step first.)"""

    def __init__(self, learner: Learner, source: BatchSource, weights: WeightSink, run_dir: Path,
                 writer: MetricsWriter, check_health: Callable[[], None]):
        self.learner, self.source, self.weights, self.writer = learner, source, weights, writer
        self.check_health = check_health
        start = time.monotonic() - learner.counters.wall_time_s
        self.telemetry = Telemetry(learner, writer, start)
        self.checkpointer = Checkpointer(learner, run_dir, start)
        self.stop = StopConditions(learner)
        self.published = learner.counters.updates  # the version actors have, at most publish_interval behind

    def step(self) -> bool:
        """The actors' health, the stop conditions, then: next batch → add → SGD step → publish →
        metrics → checkpoint, each when due. False once the run is to end."""
        self.check_health()
        self.learner.inbox.apply_to(self.learner.counters)
        if self.stop.reached():
            return False
        self.learner.wall_time_progress = self.stop.wall_time_progress()
        item = self.intake()
        if item is not None:
            self.take(*item)
        elif self.waiting_for_data():
            return True  # none came within the wait: check health and the stop conditions again
        self.train()
        if self.telemetry.due():
            self.write_metrics()
        if self.checkpointer.due():
            self.checkpointer.save()
        return True

    def write_metrics(self) -> None:
        """A metrics line, then the run's stop if too many SGD steps in a row were skipped."""
        self.telemetry.write()
        self.learner.check_diverged()

    def waiting_for_data(self) -> bool:
        """The algorithm cannot take an SGD step before a fresh batch comes, and one is still due."""
        return self.learner.algorithm.wants_data() and self.stop.budget_left()

    def intake(self) -> tuple[Batch, dict[str, torch.Tensor]] | None:
        """The next batch when the algorithm wants one (or takes one that is ready now), while the
        step budget lasts; None if none came."""
        algorithm, stages = self.learner.algorithm, self.learner.stage_seconds
        must_wait = algorithm.wants_data()
        if not self.stop.budget_left() or not (must_wait or algorithm.takes_ready_data()):
            return None
        began = time.perf_counter()
        item = self.source.next_batch(timeout_s=1.0 if must_wait else 0.0)
        stages["receive"] += time.perf_counter() - began
        return item

    def take(self, batch: Batch, meta: dict[str, torch.Tensor]) -> None:
        """Record a batch's unrolls, drop those past ``max_policy_lag``, hand the rest to the algorithm."""
        learner, counters, limit = self.learner, self.learner.counters, self.learner.config.max_policy_lag
        learner.record_unrolls(meta)  # what the actors reported, also with unrolls dropped below
        lags = counters.updates - meta["policy_version"]
        if limit is not None and (lags > limit).any():
            keep = lags <= limit
            counters.unrolls_dropped += int((~keep).sum())
            if not keep.any():
                return
            batch, lags = keep_unrolls(batch, keep), lags[keep]
            meta = {**meta, "actor_id": meta["actor_id"][keep], "created_at": meta["created_at"][keep]}
        self.telemetry.unrolls(batch, meta, lags)
        self.telemetry.consumed(learner.add(batch)["obs"])

    def train(self) -> None:
        """One SGD step if the algorithm has a batch, then a publication if it says so."""
        learner, stages = self.learner, self.learner.stage_seconds
        began = time.perf_counter()
        stats = learner.update()
        stages["train"] += time.perf_counter() - began
        if stats is None:
            return
        self.telemetry.interval.add(stats, learner.taken)
        if learner.algorithm.publish_now() and (learner.config.synchronous or learner.counters.updates
                                                >= self.published + learner.config.publish_interval):
            began = time.perf_counter()
            self.publish()
            stages["publish"] += time.perf_counter() - began

    def publish(self) -> None:
        self.weights.publish(self.learner.agent, self.learner.counters.updates)
        self.published = self.learner.counters.updates

    def ended(self) -> None:
        """After the last step: nothing to do alone (lockstep raises a peer's failure here)."""

    def run(self) -> LearnerCounters:
        counters = self.learner.counters
        self.publish()
        try:
            while self.step():
                pass
            self.ended()
        except BaseException as error:
            # Interrupted (Ctrl-C, a failed actor, a lost learner): a last metrics line counts what
            # went wrong (restarts, env errors), and a checkpoint keeps what was learned for --resume.
            self.learner.inbox.apply_to(counters)
            if not isinstance(error, RunDirFailed):
                with contextlib.suppress(RunDirFailed):  # the checkpoint below matters more
                    self.telemetry.write()
            self.checkpointer.save()
            raise
        self.learner.inbox.apply_to(counters)
        if self.learner.group.rank == 0 and self.stop.return_reached():
            self.writer.message(f"the mean return of the last {RETURN_WINDOW} episodes, "
                                f"{np.mean(counters.recent_returns):.2f}, reached --stop-at-return "
                                f"{self.learner.config.stop_at_return:g} at {counters.env_steps:,} env steps")
        self.telemetry.write()
        self.checkpointer.save()
        self.learner.check_diverged()
        return counters
