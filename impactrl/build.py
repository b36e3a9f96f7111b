"""Turn a TrainConfig into the pieces every runtime needs: env options, tasks, agent, rollout spec."""

from __future__ import annotations

import numpy as np
import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import RolloutSpec
from impactrl.envs import EnvOptions, EnvVector, make_env_vector
from impactrl.envs.factory import env_family
from impactrl.envs.tasks import TaskEnvs, TaskSet, assign_tasks, task_set
from impactrl.errors import UserError
from impactrl.models import Agent, build_agent


def env_options(config: TrainConfig) -> EnvOptions:
    return EnvOptions(
        frame_skip=config.frame_skip,
        frame_stack=config.frame_stack,
        noop_max=config.noop_max,
        sticky_action_prob=config.sticky_action_prob,
        episodic_life=config.episodic_life,
        fire_reset=config.fire_reset,
        max_episode_steps=config.max_episode_steps,
        normalize_reward_gamma=config.discount if config.normalize_rewards else None,
        image_layout=config.image_layout,
    )


def run_tasks(config: TrainConfig) -> TaskSet:
    """The run's tasks and the spaces the agent sees, read from one env per task on ``config.env_backend``."""
    options = env_options(config)

    def spaces_of(env_id: str):
        probe = make_env_vector(env_id, options, 1, backend=config.env_backend)
        try:
            return probe.observation_space, probe.action_space
        finally:
            probe.close()

    return task_set(config.env, spaces_of)


def env_tasks(config: TrainConfig, tasks: TaskSet) -> np.ndarray:
    """``[num_actors, envs_per_actor]``: the task every env of the run plays."""
    if config.task_weights and len(config.task_weights) != len(tasks.ids):
        raise UserError(f"--task-weights has {len(config.task_weights)} weights for {len(tasks.ids)} tasks "
                        f"({', '.join(tasks.ids)})")
    return assign_tasks(len(tasks.ids), config.num_actors, config.envs_per_actor, config.task_weights)


def make_training_envs(config: TrainConfig, tasks: TaskSet, actor_id: int, seed: int | None = None) -> EnvVector:
    """The envs actor ``actor_id`` steps, on ``config.env_backend``; env ``e`` is seeded ``seed + e``."""
    options = env_options(config)
    if not tasks.multi_task:
        return make_env_vector(tasks.ids[0], options, config.envs_per_actor, seed=seed, backend=config.env_backend)
    return TaskEnvs(tasks, env_tasks(config, tasks)[actor_id],
                    lambda env_id, count, first_seed: make_env_vector(env_id, options, count, seed=first_seed,
                                                                      backend=config.env_backend), seed)


def make_agent(config: TrainConfig, tasks: TaskSet) -> Agent:
    return build_agent(
        tasks.observation_space,
        tasks.action_space,
        torso=config.torso,
        hidden_sizes=config.hidden_sizes,
        use_lstm=config.use_lstm,
        lstm_size=config.lstm_size,
        normalize_observations=config.normalize_observations,
        squash_actions=config.squash_actions,
        log_std_init=config.log_std_init,
        separate_value_network=config.separate_value_network,
        task_num_actions=tasks.num_actions,
        popart_beta=config.popart_beta if config.popart else None,
    )


def rollout_spec(config: TrainConfig, agent: Agent, tasks: TaskSet) -> RolloutSpec:
    head = agent.policy_head
    state = agent.initial_state(config.envs_per_actor)
    obs_shape = tuple(tasks.observation_space.shape)
    stacked = config.frame_dedup and env_family(tasks.ids[0]) == "atari" and config.frame_stack > 1 and len(obs_shape) == 3
    return RolloutSpec(
        unroll_length=config.unroll_length,
        num_envs=config.envs_per_actor,
        obs_shape=obs_shape,
        obs_dtype=torch.from_numpy(tasks.observation_space.sample()[None]).dtype,
        action_shape=tuple(head.action_shape),
        action_dtype=head.action_dtype,
        core_state_shapes=tuple(tuple(s.shape) for s in state),
        reward_norm=config.normalize_rewards,
        frame_stack=config.frame_stack if stacked else 1,
    )
