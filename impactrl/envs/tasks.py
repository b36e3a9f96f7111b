"""Several tasks in one run: task suites, which env plays which task, and envs padded to one shape.

``--env`` names one env id, a comma-separated list of ids, or a suite (:data:`SUITES`). Tasks
are numbered in that order. All tasks of a run share one observation shape and one action space:

- observations are zero-padded at the end of every dimension to the largest size over the tasks
  (MinAtar: 4, 4, 7, 10 and 6 channels of 10×10 all become 10 channels, the extra ones zero), so
  they must have the same number of dimensions and the same dtype;
- actions must be Discrete; the shared space has the largest count, and the agent gives each
  task's missing actions probability 0 (``TaskCategoricalHead``).

The envs of a run (``num_actors × envs_per_actor``) are dealt to tasks by :func:`assign_tasks`:
round-robin, or in proportion to ``task_weights``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from impactrl.envs.factory import check_env_id, env_family, env_spec
from impactrl.envs.vector import EnvVector, VectorStep
from impactrl.errors import UserError

__all__ = ["SUITES", "TaskSet", "task_ids", "task_labels", "check_tasks", "assign_tasks", "task_set", "TaskEnvs",
           "pad_observation"]

SUITES: dict[str, tuple[str, ...]] = {
    "minatar": ("MinAtar/Asterix-v1", "MinAtar/Breakout-v1", "MinAtar/Freeway-v1", "MinAtar/Seaquest-v1",
                "MinAtar/SpaceInvaders-v1"),
}


def task_ids(env: str) -> tuple[str, ...]:
    """The env ids ``--env`` names: a suite, a comma-separated list, or one id (not checked)."""
    if env in SUITES:
        return SUITES[env]
    return tuple(part.strip() for part in env.split(","))


def task_labels(ids: Sequence[str]) -> tuple[str, ...]:
    """Short names for metrics and plots: the ids' names (``MinAtar/Breakout-v1`` → ``Breakout``),
    or the whole ids with ``/`` as ``_`` where two names would collide."""
    names = tuple(env_spec(env_id).name for env_id in ids)
    return names if len(set(names)) == len(names) else tuple(env_id.replace("/", "_") for env_id in ids)


def check_tasks(env: str) -> tuple[str, ...]:
    """Check ``--env`` (every id registered, none twice, one env family); return its ids."""
    ids = task_ids(env)
    close = difflib.get_close_matches(env.strip().lower(), list(SUITES), n=1, cutoff=0.75)
    if close and len(ids) == 1:
        try:
            check_env_id(env)
        except UserError:
            raise UserError(f"unknown environment id or task suite {env!r}; did you mean the suite {close[0]!r}?") from None
    if len(ids) > 1 and any(not env_id for env_id in ids):
        raise UserError(f"--env {env!r}: an empty id in the list (ids are separated by single commas)")
    for env_id in ids:
        check_env_id(env_id)
    repeated = sorted({env_id for env_id in ids if ids.count(env_id) > 1})
    if repeated:
        raise UserError(f"--env lists {', '.join(repeated)} more than once; use --task-weights to give a task more envs")
    families = {env_id: env_family(env_id) for env_id in ids}
    if len(set(families.values())) > 1:
        listed = ", ".join(f"{env_id} ({family})" for env_id, family in families.items())
        raise UserError(f"the tasks of one run must come from one env family (their presets and preprocessing "
                        f"differ), got {listed}")
    return ids


def reward_threshold(env: str) -> float | None:
    """The return at which Gymnasium considers the env solved, if it says; None for several tasks."""
    ids = task_ids(env)
    return env_spec(ids[0]).reward_threshold if len(ids) == 1 else None


def tasks_family(env: str) -> str:
    """The env family of ``--env``'s tasks (checked)."""
    return env_family(check_tasks(env)[0])


def assign_tasks(num_tasks: int, num_actors: int, envs_per_actor: int,
                 weights: Sequence[float] = ()) -> np.ndarray:
    """``[num_actors, envs_per_actor]``: the task of every env of the run.

    Without ``weights`` the run's envs (actor by actor) take tasks round-robin. With them, each
    task gets a share of the envs proportional to its weight (largest remainders, at least one
    each), and the envs are dealt in round-robin order over the tasks that still have some left,
    so every actor plays a mix. Raises ``UserError`` when there are fewer envs than tasks.
    """
    total = num_actors * envs_per_actor
    if total < num_tasks:
        raise UserError(f"{num_tasks} tasks need at least {num_tasks} envs, but the run has {num_actors} actors × "
                        f"{envs_per_actor} envs = {total}: raise --num-actors or --envs-per-actor")
    if not weights:
        return (np.arange(total) % num_tasks).reshape(num_actors, envs_per_actor)
    share = np.asarray(weights, np.float64) / float(np.sum(weights)) * (total - num_tasks)
    counts = 1 + np.floor(share).astype(np.int64)
    for task in np.argsort(-(share - np.floor(share)), kind="stable")[: total - int(counts.sum())]:
        counts[task] += 1
    order, left = [], counts.copy()
    while len(order) < total:
        for task in range(num_tasks):
            if left[task]:
                order.append(task)
                left[task] -= 1
    return np.asarray(order, np.int64).reshape(num_actors, envs_per_actor)


@dataclass(frozen=True)
class TaskSet:
    """The tasks of a run and the one observation and action space the agent sees for all."""

    ids: tuple[str, ...]
    labels: tuple[str, ...]
    observation_space: gym.spaces.Space
    action_space: gym.spaces.Space
    num_actions: tuple[int, ...] | None  # Discrete actions per task; None for a single task

    @property
    def multi_task(self) -> bool:
        return len(self.ids) > 1


def task_set(env: str, spaces_of: Callable[[str], tuple[gym.Space, gym.Space]]) -> TaskSet:
    """The tasks of ``--env`` with their shared spaces, ``spaces_of(env_id)`` giving each task's
    ``(observation_space, action_space)``; ``UserError`` when an observation space is no Box (which
    the agent needs) or the tasks cannot share them."""
    ids = check_tasks(env)
    spaces = [spaces_of(env_id) for env_id in ids]
    for env_id, (observation, _) in zip(ids, spaces):
        if not isinstance(observation, gym.spaces.Box):
            raise UserError(f"{env_id}'s observation space {' '.join(str(observation).split())} is not supported: "
                            "impactrl needs Box observations (gymnasium.wrappers.FlattenObservation makes one of a "
                            "Dict or Tuple)")
    labels = task_labels(ids)
    if len(ids) == 1:
        return TaskSet(ids, labels, spaces[0][0], spaces[0][1], None)
    observations = [observation for observation, _ in spaces]
    for env_id, (observation, action) in zip(ids, spaces):
        if not isinstance(action, gym.spaces.Discrete) or int(action.start) != 0:
            raise UserError(f"multi-task runs need Discrete actions starting at 0, but {env_id} has {action}")
        if len(observation.shape) != len(observations[0].shape) or observation.dtype != observations[0].dtype:
            raise UserError(f"the tasks' observations cannot be padded to one shape: {ids[0]} has "
                            f"{observations[0].shape} {observations[0].dtype}, {env_id} has {observation.shape} "
                            f"{observation.dtype}")
    shape = tuple(int(size) for size in np.max([observation.shape for observation in observations], axis=0))
    low = np.min([pad_observation(np.broadcast_to(o.low, o.shape), shape) for o in observations], axis=0)
    high = np.max([pad_observation(np.broadcast_to(o.high, o.shape), shape) for o in observations], axis=0)
    num_actions = tuple(int(action.n) for _, action in spaces)
    return TaskSet(ids, labels, gym.spaces.Box(low, high, shape, observations[0].dtype),
                   gym.spaces.Discrete(max(num_actions)), num_actions)


def pad_observation(observation: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``observation`` zero-padded at the end of each dimension to ``shape``."""
    out = np.zeros(shape, observation.dtype)
    out[tuple(slice(0, size) for size in observation.shape)] = observation
    return out


class TaskEnvs:
    """An actor's envs over several tasks as one :class:`EnvVector` with the tasks' shared spaces.

    ``tasks[e]`` is env ``e``'s task; the envs of each task are one vector of the run's backend,
    built by ``make_vector(env_id, count, seed)``. Observations are zero-padded to the shared shape.
    """

    def __init__(self, tasks: TaskSet, env_tasks: Sequence[int], make_vector, seed: int | None):
        self.task_set = tasks
        self.env_tasks = np.asarray(env_tasks, np.int64)
        self.num_envs = len(self.env_tasks)
        self.observation_space = tasks.observation_space
        self.action_space = tasks.action_space
        self.groups: list[tuple[np.ndarray, EnvVector]] = []
        try:
            for task in np.unique(self.env_tasks).tolist():
                envs = np.flatnonzero(self.env_tasks == task)
                vector_seed = None if seed is None else seed + int(envs[0])
                self.groups.append((envs, make_vector(tasks.ids[task], len(envs), vector_seed)))
        except BaseException:
            self.close()
            raise
        self._obs = np.zeros((self.num_envs, *self.observation_space.shape), self.observation_space.dtype)

    def _put(self, envs: np.ndarray, obs: np.ndarray) -> None:
        self._obs[(envs, *(slice(0, size) for size in obs.shape[1:]))] = obs

    def reset(self) -> np.ndarray:
        for envs, vector in self.groups:
            self._put(envs, vector.reset())
        return self._obs

    def step(self, action: np.ndarray) -> VectorStep:
        E = self.num_envs
        step = VectorStep(self._obs, np.zeros(E, np.float32), np.zeros(E, bool), np.zeros(E, bool),
                          np.full(E, np.nan, np.float32), np.zeros(E, np.int64), {})
        for envs, vector in self.groups:
            part = vector.step(action[envs])
            self._put(envs, part.obs)
            for name in ("reward", "terminated", "truncated", "episode_return", "episode_length"):
                getattr(step, name)[envs] = getattr(part, name)
            for e, final in part.final_obs.items():
                step.final_obs[int(envs[e])] = pad_observation(final, self.observation_space.shape)
        return step

    def reward_stats(self) -> np.ndarray | None:
        parts = [(envs, vector.reward_stats()) for envs, vector in self.groups]
        if parts[0][1] is None:
            return None
        stats = np.zeros((self.num_envs, parts[0][1].shape[1]), np.float64)
        for envs, part in parts:
            stats[envs] = part
        return stats

    def set_reward_stats(self, stats: np.ndarray) -> None:
        for envs, vector in self.groups:
            vector.set_reward_stats(stats[envs])

    def close(self) -> None:
        for _, vector in self.groups:
            vector.close()
