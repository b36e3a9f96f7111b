"""Turn a TrainConfig into the pieces every runtime needs: env options, agent, rollout spec."""

from __future__ import annotations

import gymnasium as gym
import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import RolloutSpec
from impactrl.envs import EnvOptions, EnvVector, make_env_vector
from impactrl.models import Agent, build_agent


def env_options(config: TrainConfig) -> EnvOptions:
    return EnvOptions(
        frame_skip=config.frame_skip,
        frame_stack=config.frame_stack,
        noop_max=config.noop_max,
        sticky_action_prob=config.sticky_action_prob,
        episodic_life=config.episodic_life,
        max_episode_steps=config.max_episode_steps,
        normalize_reward_gamma=config.discount if config.normalize_rewards else None,
    )


def make_training_envs(config: TrainConfig, num_envs: int, seed: int | None = None) -> EnvVector:
    """The envs one actor steps, on ``config.env_backend``; env ``e`` is seeded ``seed + e``."""
    return make_env_vector(config.env, env_options(config), num_envs, seed=seed, backend=config.env_backend)


def make_agent(config: TrainConfig, observation_space: gym.Space, action_space: gym.Space) -> Agent:
    return build_agent(
        observation_space,
        action_space,
        torso=config.torso,
        hidden_sizes=config.hidden_sizes,
        use_lstm=config.use_lstm,
        lstm_size=config.lstm_size,
        normalize_observations=config.normalize_observations,
        squash_actions=config.squash_actions,
        log_std_init=config.log_std_init,
        separate_value_network=config.separate_value_network,
    )


def rollout_spec(config: TrainConfig, agent: Agent, observation_space: gym.Space) -> RolloutSpec:
    head = agent.policy_head
    state = agent.initial_state(config.envs_per_actor)
    return RolloutSpec(
        unroll_length=config.unroll_length,
        num_envs=config.envs_per_actor,
        obs_shape=tuple(observation_space.shape),
        obs_dtype=torch.from_numpy(observation_space.sample()[None]).dtype,
        action_shape=tuple(head.action_shape),
        action_dtype=head.action_dtype,
        core_state_shapes=tuple(tuple(s.shape) for s in state),
        reward_norm=config.normalize_rewards,
    )
