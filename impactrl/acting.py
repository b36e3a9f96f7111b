"""The acting step the actor and ``impactrl eval`` share: E envs played in lockstep, one batched
forward pass per step, and what each step carries to the next.

Per env the agent sees x_t with ``first`` (x_t starts an episode), the previous action and reward
(0 where x_t starts an episode) and the LSTM state. The previous reward is the one the learner
trains on: with --normalize-rewards training's envs return it normalised, so envs that return raw
rewards (eval's) hand ``Acting`` the scale training's normalisers reached, and it scales them the
same way. An episode a time limit cut bootstraps from V(x_final), computed from the state that led
to x_final (docs/algorithms.md#episode-ends-and-truncation).
How actions are chosen from the policy and how envs are stepped and reset is the caller's.
"""

from __future__ import annotations

import numpy as np
import torch

from impactrl.models import Agent, AgentInput

NORMALIZED_REWARD_CLIP = 10.0  # make_env clips normalised training rewards to ±10


class Acting:
    """The recurrent inputs of ``len(tasks)`` envs (each playing task ``tasks[e]``) and the
    forward pass over them. ``reward_scale``: for envs that return raw rewards where training's
    normalised them (``make_env``'s --normalize-rewards: r / σ, clipped to ±10), that σ."""

    def __init__(self, agent: Agent, tasks: np.ndarray, reward_scale: float | None = None):
        self.agent = agent
        self.tasks = tasks
        self.reward_scale = reward_scale
        self.start_episodes()

    def start_episodes(self) -> None:
        """Every env at the start of an episode, the LSTM state zero."""
        E, head = len(self.tasks), self.agent.policy_head
        self.first = np.ones(E, dtype=bool)
        self.prev_action = torch.zeros((E, *head.action_shape), dtype=head.action_dtype).numpy()
        self.prev_reward = np.zeros(E, dtype=np.float32)
        self.core_state = self.agent.initial_state(E)
        self._next_core_state = self.core_state

    def _forward(self, obs: np.ndarray, prev_action: np.ndarray, prev_reward: np.ndarray, first: np.ndarray,
                 core_state: tuple[torch.Tensor, ...]):
        inputs = AgentInput(obs=torch.from_numpy(obs)[None], prev_action=torch.from_numpy(prev_action)[None],
                            prev_reward=torch.from_numpy(prev_reward)[None], first=torch.from_numpy(first)[None],
                            task=torch.from_numpy(self.tasks)[None])
        output, core_state = self.agent(inputs, core_state)
        return output.policy[0], output.value[0], core_state

    def act(self, obs: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy and value ``[E, ...]`` at x_t = ``obs``; ``advance`` takes the state on."""
        policy, value, self._next_core_state = self._forward(obs, self.prev_action, self.prev_reward, self.first,
                                                             self.core_state)
        return policy, value

    def learner_reward(self, reward: np.ndarray) -> np.ndarray:
        """The envs' ``reward`` as the learner trained on it (float32)."""
        if self.reward_scale is None:
            return np.asarray(reward, dtype=np.float32)
        scaled = np.asarray(reward, dtype=np.float64) / self.reward_scale
        return np.clip(scaled, -NORMALIZED_REWARD_CLIP, NORMALIZED_REWARD_CLIP).astype(np.float32)

    def advance(self, action: np.ndarray, reward: np.ndarray, done: np.ndarray) -> None:
        """After the envs stepped with ``action`` for ``reward``: x_{t+1} starts an episode where
        ``done``, and there the previous action and reward are 0."""
        self.core_state = self._next_core_state
        self.first = done.copy()
        self.prev_action = np.where(done.reshape(-1, *[1] * (action.ndim - 1)), 0, action).astype(action.dtype)
        self.prev_reward = np.where(done, 0.0, self.learner_reward(reward)).astype(np.float32)

    def truncation_values(self, obs: np.ndarray, final_obs: dict[int, np.ndarray], action: np.ndarray,
                          reward: np.ndarray) -> dict[int, float]:
        """V(x_final) of the envs in ``final_obs`` (env -> its final observation), whose episode a
        time limit cut at the step just taken with ``action`` for ``reward``; call it after
        ``advance``. ``obs`` fills the other envs' places."""
        obs = obs.copy()
        for e, observation in final_obs.items():
            obs[e] = observation
        _, value, _ = self._forward(obs, action, self.learner_reward(reward), np.zeros_like(self.first),
                                    self.core_state)
        return {e: value[e].item() for e in final_obs}
