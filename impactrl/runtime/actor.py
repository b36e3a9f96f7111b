"""The actor loop: step a vector of environments with a local copy of the behaviour policy μ.

It knows nothing about processes, shared memory or Ray. A runtime hands it two endpoints::

    weights = WeightSource   (learner -> actor: the newest weights and their version)
    sink    = RolloutSink    (actor -> learner: a slot to write one unroll into, then commit)

and the loop is::

    load the newest weights (version v)
    forever:
        synchronous (PPO)? wait until weights.version() > the version of the last unroll
        slot = sink.acquire()                      # blocks while the learner is behind
        if weights.version() > v: load them        # only at unroll boundaries
        write the core state, then T steps of (x_t, a_t, log μ(a_t|x_t), r_t, ...) and x_T
        sink.commit(slot, version=v)               # the unroll records which μ produced it
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

import numpy as np
import torch

from impactrl.build import make_agent, make_training_envs
from impactrl.config import TrainConfig
from impactrl.data.rollout import ACTOR_STAGES
from impactrl.models import Agent, AgentInput


class WeightSource(Protocol):
    def version(self) -> int:
        """The version of the newest published weights (cheap; called once per unroll)."""

    def load_into(self, agent: Agent) -> int:
        """Copy the newest weights into ``agent`` and return their version."""


class RolloutSink(Protocol):
    def acquire(self) -> int | None:
        """Block until a slot is free and return its index; None when the run is stopping."""

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        """Writable arrays of the slot's fields (see ``impactrl.data.rollout``)."""

    def commit(self, slot: int, policy_version: int, stage_seconds: dict[str, float]) -> None:
        """Hand the written slot to the learner, with where the actor's time went (ACTOR_STAGES)."""


def env_seed(config: TrainConfig, actor_id: int, env_index: int, generation: int) -> int:
    """Distinct seeds per run seed, actor, env and actor generation (restart or resume). Kept
    below 2**30 so that an actor's ``seed + env_index`` stays a 32-bit seed (EnvPool's type)."""
    return (config.seed * 1_000_003 + generation * 10_007 + actor_id * config.envs_per_actor + env_index) % 2**30


class Actor:
    """One actor: E environments stepped in lockstep, one batched forward pass per step."""

    def __init__(self, config: TrainConfig, actor_id: int, generation: int = 0):
        self.config = config
        self.actor_id = actor_id
        E = config.envs_per_actor
        self.envs = make_training_envs(config, E, seed=env_seed(config, actor_id, 0, generation))
        first_obs = self.envs.reset()
        self.agent = make_agent(config, self.envs.observation_space, self.envs.action_space)
        self.agent.eval()
        head = self.agent.policy_head
        self.obs = first_obs
        self.first = np.ones(E, dtype=bool)
        self.prev_action = torch.zeros((E, *head.action_shape), dtype=head.action_dtype).numpy()
        self.prev_reward = np.zeros(E, dtype=np.float32)
        self.core_state = self.agent.initial_state(E)
        self.stage_seconds = dict.fromkeys(ACTOR_STAGES, 0.0)
        torch.manual_seed(env_seed(config, actor_id, 0, generation))

    def _forward(self, obs: np.ndarray, prev_action: np.ndarray, prev_reward: np.ndarray,
                 first: np.ndarray, core_state: tuple[torch.Tensor, ...]):
        inputs = AgentInput(
            obs=torch.from_numpy(obs)[None],
            prev_action=torch.from_numpy(prev_action)[None],
            prev_reward=torch.from_numpy(prev_reward)[None],
            first=torch.from_numpy(first)[None],
        )
        output, core_state = self.agent(inputs, core_state)
        return output.policy[0], output.value[0], core_state

    @torch.inference_mode()
    def unroll(self, arrays: dict[str, np.ndarray]) -> None:
        """Write one unroll of T steps into ``arrays`` (the fields of a rollout slot)."""
        head = self.agent.policy_head
        for i, state in enumerate(self.core_state):
            arrays[f"core_state_{i}"][...] = state.numpy()
        arrays["truncation_value"].fill(0.0)
        for t in range(self.config.unroll_length):
            arrays["obs"][t] = self.obs
            arrays["first"][t] = self.first
            arrays["prev_action"][t] = self.prev_action
            arrays["prev_reward"][t] = self.prev_reward
            began = time.perf_counter()
            policy, _, next_core_state = self._forward(
                arrays["obs"][t], arrays["prev_action"][t], arrays["prev_reward"][t], arrays["first"][t],
                self.core_state)
            action, log_prob = head.sample_with_log_prob(policy)
            arrays["behaviour_log_prob"][t] = log_prob.numpy()
            action = action.numpy()
            arrays["action"][t] = action
            inferred = time.perf_counter()
            self._step_envs(t, action, next_core_state, arrays)
            self.stage_seconds["inference"] += inferred - began
            self.stage_seconds["env"] += time.perf_counter() - inferred
            self.core_state = next_core_state
        T = self.config.unroll_length
        arrays["obs"][T] = self.obs
        arrays["first"][T] = self.first
        arrays["prev_action"][T] = self.prev_action
        arrays["prev_reward"][T] = self.prev_reward

    def _step_envs(self, t: int, action: np.ndarray, core_state, arrays: dict[str, np.ndarray]) -> None:
        step = self.envs.step(action)
        arrays["reward"][t] = step.reward
        arrays["terminated"][t] = step.terminated
        arrays["truncated"][t] = step.truncated
        arrays["episode_return"][t] = step.episode_return
        arrays["episode_length"][t] = step.episode_length
        self.obs = step.obs
        if step.final_obs:
            self._truncation_values(t, action, step.final_obs, core_state, arrays)
        done = step.terminated | step.truncated
        self.first = done
        self.prev_action = np.where(done.reshape(-1, *[1] * (action.ndim - 1)), 0, action).astype(action.dtype)
        self.prev_reward = np.where(done, 0.0, step.reward).astype(np.float32)

    def _truncation_values(self, t, action, final_obs, core_state, arrays) -> None:
        """V(x_final) for the envs a time limit cut: the learner bootstraps from it."""
        obs = self.obs.copy()
        for e, o in final_obs.items():
            obs[e] = o
        _, value, _ = self._forward(obs, action, arrays["reward"][t], np.zeros_like(self.first), core_state)
        for e in final_obs:
            arrays["truncation_value"][t, e] = value[e].item()

    def close(self) -> None:
        self.envs.close()


def run_actor(config: TrainConfig, actor_id: int, weights: WeightSource, sink: RolloutSink,
              should_stop: Callable[[], bool], generation: int = 0) -> None:
    """The actor loop, for any runtime: see the module docstring."""
    torch.set_num_threads(1)
    actor = Actor(config, actor_id, generation)
    try:
        version = weights.load_into(actor.agent)
        last_used = None
        while not should_stop():
            began = time.perf_counter()
            if config.synchronous and last_used is not None:
                # Synchronous (PPO): the next unroll must come from the weights trained on the last.
                while weights.version() <= last_used and not should_stop():
                    time.sleep(0.0005)
            slot = sink.acquire()
            if slot is None:
                break
            actor.stage_seconds = dict.fromkeys(ACTOR_STAGES, 0.0)
            actor.stage_seconds["wait"] = time.perf_counter() - began
            if weights.version() > version:
                version = weights.load_into(actor.agent)
            actor.unroll(sink.arrays(slot))
            sink.commit(slot, version, actor.stage_seconds)
            last_used = version
    finally:
        actor.close()
