"""The actor loop: step a vector of environments with a local copy of the behaviour policy μ.

It knows nothing about processes, shared memory or Ray. A runtime hands it two endpoints::

    weights = WeightSource   (learner -> actor: the newest weights, their version and publication)
    sink    = RolloutSink    (actor -> learner: a slot to write one unroll into, then commit)

and the loop is::

    load the newest weights (version v, publication p)
    forever:
        synchronous (PPO) and the last unroll used publication p? wait for publication p + 1
        slot = sink.acquire()                      # blocks while the learner is behind
        if a newer publication exists: load it     # only at unroll boundaries
        write the core state, then T steps of (x_t, a_t, log μ(a_t|x_t), r_t, ...) and x_T
        sink.commit(slot, UnrollRecord(version v, ...))   # which μ produced it, env faults
        sink.heartbeat()                           # also in every wait: the actor is not hung

An env that raises in ``step`` or ``reset`` is rebuilt (fresh seeds, episodes restarted, reward
normalisers carried over); the unroll it broke is dropped and its slot reused, and the fault
travels with the next unroll as ``env_errors``. Envs that break ``ENV_FAILED_UNROLLS`` unrolls in
a row raise :class:`EnvKeepsFailing` with the env's own error: the actor process ends and the
runtime restarts it against the restart budget, so an env that fails in every unroll stops the
run with its cause instead of looping unseen. Envs that cannot be reset ``ENV_RESET_ATTEMPTS``
times in a row raise :class:`~impactrl.errors.EnvBroken`, which stops the run.
"""

from __future__ import annotations

import time
import traceback
from typing import Callable, NamedTuple, Protocol

import numpy as np
import torch

from impactrl.acting import Acting
from impactrl.build import env_tasks, make_agent, make_training_envs, run_tasks
from impactrl.config import TrainConfig
from impactrl.data.rollout import ACTOR_STAGES, FramePacker, FrameRoomExceeded, RolloutSpec, UnrollRecord
from impactrl.envs import EnvVector
from impactrl.errors import EnvBroken
from impactrl.models import Agent

# Rebuilds in a row whose first reset raises before the actor gives up on its envs.
ENV_RESET_ATTEMPTS = 3
# Unrolls in a row broken by an env fault before the actor process gives up (and is restarted).
ENV_FAILED_UNROLLS = 3


class WeightSource(Protocol):
    def publication(self) -> int:
        """How many times weights were published (cheap; called once per unroll)."""

    def load_into(self, agent: Agent) -> tuple[int, int]:
        """Copy the newest weights into ``agent``; return their version and publication."""


class RolloutSink(Protocol):
    def acquire(self) -> int | None:
        """Block until a slot is free and return its index; None when the run is stopping."""

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        """Writable arrays of the slot's fields (see ``impactrl.data.rollout``)."""

    def commit(self, slot: int, record: UnrollRecord) -> None:
        """Hand the written slot to the learner, with what the actor reports about it."""

    def heartbeat(self) -> None:
        """Tell the runtime this actor is alive and not hung (once per unroll and in every wait)."""


class StartArgs(NamedTuple):
    """What a new actor process starts its loop with."""

    generation: int  # of its seeds: never one used before (ActorHandle.next_generation)
    reward_stats: np.ndarray | None  # its reward normalisers as of its last consumed unroll
    committed_with: int | None = None  # run_actor's: the publication its predecessor's last received unroll used


class ActorProgram(Protocol):
    """What an actor process runs for its ``actors_per_process`` actors, whatever the runtime: the
    runtimes start the processes and hand them their channels; ``EnvActors`` steps envs, and
    ``impactrl bench --synthetic-actors`` plugs its replaying actors in here (runtime/synthetic.py)."""

    actors_per_process: int

    def run(self, config: TrainConfig, spec: RolloutSpec, actor_ids: list[int], start: StartArgs,
            weights: WeightSource, sinks: list, should_stop: Callable[[], bool], wait: Callable[[float], None]) -> None:
        """Write unrolls into ``sinks`` (one per actor id) until ``should_stop``; ``wait(timeout)``
        blocks until a slot may have come free."""


class EnvActors:
    """The actors of a training run: one per process, ``run_actor`` on its envs."""

    actors_per_process = 1

    def run(self, config: TrainConfig, spec: RolloutSpec, actor_ids: list[int], start: StartArgs,
            weights: WeightSource, sinks: list, should_stop: Callable[[], bool], wait: Callable[[float], None]) -> None:
        run_actor(config, actor_ids[0], weights, sinks[0], should_stop, start.generation, start.reward_stats,
                  start.committed_with)


ENV_ACTORS = EnvActors()  # every runtime's default program


class EnvFailed(Exception):
    """An env raised in ``step`` or ``reset``; the actor rebuilds its envs."""


class EnvKeepsFailing(RuntimeError):
    """The envs broke ``ENV_FAILED_UNROLLS`` unrolls in a row; ``env_errors`` counts the faults
    no committed unroll reported."""

    def __init__(self, message: str, env_errors: int):
        super().__init__(message)
        self.env_errors = env_errors


def describe_env_error(env_id: str, error: BaseException) -> str:
    """``ENV raised TYPE: MESSAGE in FUNCTION (FILE:LINE)``, the innermost frame being where the env raised."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" in {frames[-1].name} ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{env_id} raised {type(error).__name__}: {error}{where}"


def env_seed(config: TrainConfig, actor_id: int, env_index: int, generation: int, rebuild: int = 0) -> int:
    """Distinct seeds per run seed, actor, env, actor generation (restart or resume) and env
    rebuild after a fault. Kept below 2**30 so that an actor's ``seed + env_index`` stays a 32-bit
    seed (EnvPool's type)."""
    return (config.seed * 1_000_003 + generation * 10_007 + rebuild * 7_919_017
            + actor_id * config.envs_per_actor + env_index) % 2**30


class Actor:
    """One actor: E environments stepped in lockstep, one batched forward pass per step."""

    def __init__(self, config: TrainConfig, actor_id: int, generation: int = 0,
                 reward_stats: np.ndarray | None = None):
        self.config = config
        self.actor_id = actor_id
        self.generation = generation
        self.rebuilds = 0
        self.env_errors = 0  # since the last committed unroll
        self.envs: EnvVector | None = None
        self.tasks = run_tasks(config)
        self.env_tasks = env_tasks(config, self.tasks)[actor_id]  # [E]: the task each env plays
        self._start_envs(reward_stats)
        self.agent = make_agent(config, self.tasks)
        self.agent.eval()
        self.acting = Acting(self.agent, self.env_tasks)  # the step eval shares
        self.stage_seconds = dict.fromkeys(ACTOR_STAGES, 0.0)
        self.packer: FramePacker | None = None  # made by the first unroll into a slot with de-duplicated frames
        torch.manual_seed(env_seed(config, actor_id, 0, generation))

    def _start_envs(self, reward_stats: np.ndarray | None) -> None:
        """Build and reset the envs, retrying with fresh seeds; EnvBroken when every attempt fails."""
        for _ in range(ENV_RESET_ATTEMPTS):
            seed = env_seed(self.config, self.actor_id, 0, self.generation, self.rebuilds)
            self.rebuilds += 1
            try:
                self.envs = make_training_envs(self.config, self.tasks, self.actor_id, seed=seed)
                if reward_stats is not None and not np.isnan(reward_stats).any():
                    self.envs.set_reward_stats(reward_stats)
                self.obs = self.envs.reset()
                return
            except Exception as error:  # noqa: BLE001 - any env fault is retried, then reported
                self.env_errors += 1
                self._close_envs()
                failure = error
        raise EnvBroken(f"actor {self.actor_id}: {self.config.env} raised on reset {ENV_RESET_ATTEMPTS} times in a row "
                        f"(last: {type(failure).__name__}: {failure})") from failure

    def rebuild_envs(self) -> None:
        """After an env fault: new envs with new seeds, every episode restarted, reward
        normalisers kept (a broken env may no longer report them; then they start afresh)."""
        self.env_errors += 1
        try:
            reward_stats = self.envs.reward_stats()
        except Exception:  # noqa: BLE001
            reward_stats = None
        self._close_envs()
        self._start_envs(reward_stats)
        self.acting.start_episodes()

    def _close_envs(self) -> None:
        if self.envs is not None:
            try:
                self.envs.close()
            except Exception:  # noqa: BLE001 - a broken env may fail to close; it is dropped anyway
                pass
            self.envs = None

    def record(self, policy_version: int) -> UnrollRecord:
        """What the actor reports with the unroll it just wrote; resets its per-unroll counts."""
        record = UnrollRecord(self.actor_id, policy_version, self.stage_seconds, self.env_errors,
                              self.envs.reward_stats())
        self.env_errors = 0
        return record

    @torch.inference_mode()
    def unroll(self, arrays: dict[str, np.ndarray]) -> None:
        """Write one unroll of T steps into ``arrays`` (the fields of a rollout slot)."""
        head = self.agent.policy_head
        if "frames" in arrays and self.packer is None:
            self.packer = FramePacker(len(arrays["frames"]), self.config.envs_per_actor)
        for i, state in enumerate(self.acting.core_state):
            arrays[f"core_state_{i}"][...] = state.numpy()
        arrays["truncation_value"].fill(0.0)
        arrays["task"][...] = self.env_tasks
        for t in range(self.config.unroll_length):
            self._write_inputs(arrays, t)
            began = time.perf_counter()
            policy, _ = self.acting.act(self.obs)
            action, log_prob = head.sample_with_log_prob(policy)
            arrays["behaviour_log_prob"][t] = log_prob.numpy()
            action = action.numpy()
            arrays["action"][t] = action
            inferred = time.perf_counter()
            self._step_envs(t, action, arrays)
            self.stage_seconds["inference"] += inferred - began
            self.stage_seconds["env"] += time.perf_counter() - inferred
        self._write_inputs(arrays, self.config.unroll_length)

    def _write_inputs(self, arrays: dict[str, np.ndarray], t: int) -> None:
        """x_t and what comes with it: the observation (its new frames only, with a packer)."""
        if self.packer is not None:
            try:
                self.packer.write(arrays, t, self.obs)
            except FrameRoomExceeded as error:
                raise EnvBroken(f"actor {self.actor_id}: {error}") from None
        else:
            arrays["obs"][t] = self.obs
        arrays["first"][t] = self.acting.first
        arrays["prev_action"][t] = self.acting.prev_action
        arrays["prev_reward"][t] = self.acting.prev_reward

    def _step_envs(self, t: int, action: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
        try:
            step = self.envs.step(action)
        except Exception as error:  # noqa: BLE001 - any env fault: the actor rebuilds its envs
            raise EnvFailed(describe_env_error(self.config.env, error)) from error
        arrays["reward"][t] = step.reward
        arrays["terminated"][t] = step.terminated
        arrays["truncated"][t] = step.truncated
        arrays["episode_return"][t] = step.episode_return
        arrays["episode_length"][t] = step.episode_length
        self.obs = step.obs
        self.acting.advance(action, step.reward, step.terminated | step.truncated)
        if step.final_obs:  # V(x_final) for the envs a time limit cut: the learner bootstraps from it
            values = self.acting.truncation_values(self.obs, step.final_obs, action, arrays["reward"][t])
            for e, value in values.items():
                arrays["truncation_value"][t, e] = value

    def close(self) -> None:
        self._close_envs()


def run_actor(config: TrainConfig, actor_id: int, weights: WeightSource, sink: RolloutSink,
              should_stop: Callable[[], bool], generation: int = 0, reward_stats: np.ndarray | None = None,
              committed_with: int | None = None) -> None:
    """The actor loop, for any runtime: see the module docstring. ``generation`` makes a
    restarted or resumed actor's seeds new; ``reward_stats`` restores its reward normalisers.

    ``committed_with``: for a restarted actor, the publication its previous generation's last
    unroll that reached the learner was acted with. A synchronous (PPO) run takes exactly one
    unroll per actor and publication, so the actor waits for a newer one. Only the learner
    knows it: an unroll committed just before a death may or may not have arrived, and one
    that did not must be acted again with the same weights."""
    torch.set_num_threads(1)
    actor = Actor(config, actor_id, generation, reward_stats)
    try:
        version, publication = weights.load_into(actor.agent)
        slot = None  # kept when an env fault drops an unroll, so the next one reuses it
        failed_in_a_row = 0
        while not should_stop():
            began = time.perf_counter()
            # Synchronous (PPO): the next unroll must come from the weights trained on the last.
            # Waiting for a new publication, not a higher version, cannot hang: every batch ends
            # in one, even when all its updates were skipped.
            while (config.synchronous and committed_with is not None and weights.publication() <= committed_with
                   and not should_stop()):
                sink.heartbeat()
                time.sleep(0.0005)
            if slot is None:
                slot = sink.acquire()
                if slot is None:
                    break
            actor.stage_seconds = dict.fromkeys(ACTOR_STAGES, 0.0)
            actor.stage_seconds["wait"] = time.perf_counter() - began
            if weights.publication() > publication:
                version, publication = weights.load_into(actor.agent)
            try:
                actor.unroll(sink.arrays(slot))
            except EnvFailed as error:
                failed_in_a_row += 1
                if failed_in_a_row >= ENV_FAILED_UNROLLS:
                    raise EnvKeepsFailing(f"actor {actor_id}: the envs broke {failed_in_a_row} unrolls in a row; "
                                          f"last: {error}", actor.env_errors + 1) from error
                actor.rebuild_envs()
                sink.heartbeat()
                continue
            sink.commit(slot, actor.record(version))
            slot, committed_with, failed_in_a_row = None, publication, 0  # the publication this unroll was acted with
            sink.heartbeat()
    finally:
        actor.close()
