"""E environments as an actor steps them: together, each reset as soon as its episode ends.

Two backends give the same contract (:class:`EnvVector`):

- :class:`GymnasiumEnvs` — E envs from :func:`make_env`, stepped one after the other in this
  process. Any Gymnasium id, every option.
- :class:`EnvPoolEnvs` — one EnvPool (C++ envs, stepped without the Python wrapper stack) for
  the Atari and classic-control ids EnvPool provides. Optional: ``pip install envpool``.

Contract of :meth:`EnvVector.step`: the returned ``obs`` already holds the first observation of
the next episode for every env whose episode ended; ``final_obs`` keeps the last observation of
episodes a time limit cut (the actor bootstraps from it); ``episode_return``/``episode_length``
are NaN/0 except where a whole game ended, and then hold its unclipped return and length (for
Atari in emulator frames). Under Atari's episodic life a lost life gives ``terminated`` without
an episode record, and the game goes on.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from typing import Protocol

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import NormalizeReward

from impactrl.config import EnvBackend
from impactrl.envs.factory import EnvOptions, env_family, env_spec, make_env, register_all
from impactrl.envs.wrappers import FIRE, waits_for_fire
from impactrl.errors import UserError

__all__ = ["EnvBackend", "EnvVector", "VectorStep", "GymnasiumEnvs", "EnvPoolEnvs", "make_env_vector"]

# ALE's v5 ids cap a game at 108,000 emulator frames; EnvPool counts agent steps instead.
ALE_MAX_FRAMES = 108_000


@dataclass
class VectorStep:
    obs: np.ndarray  # (E, ...) observations to act on next
    reward: np.ndarray  # (E,) float32
    terminated: np.ndarray  # (E,) bool: the training episode ended (game over or, episodic life, a lost life)
    truncated: np.ndarray  # (E,) bool: a time limit cut the episode (never together with terminated)
    episode_return: np.ndarray  # (E,) float32, NaN except where a whole game ended
    episode_length: np.ndarray  # (E,) int64, 0 except where a whole game ended
    final_obs: dict[int, np.ndarray]  # env index -> last observation, for the truncated envs


class EnvVector(Protocol):
    num_envs: int
    observation_space: gym.Space
    action_space: gym.Space

    def reset(self) -> np.ndarray:
        """Start every env (seeded on the first call) and return the (E, ...) observations."""

    def step(self, action: np.ndarray) -> VectorStep:
        """Step every env with its action; see the module docstring for what comes back."""

    def reward_stats(self) -> np.ndarray | None:
        """``[E, 3]`` running mean, var and count of each env's discounted return, as its reward
        normaliser holds them; None without reward normalisation."""

    def set_reward_stats(self, stats: np.ndarray) -> None:
        """Start each env's reward normaliser from ``stats`` (as :meth:`reward_stats` returns)."""

    def close(self) -> None: ...


def _no_episode_records(num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(episode_return, episode_length)`` for a step in which no game ended."""
    return np.full(num_envs, np.nan, np.float32), np.zeros(num_envs, np.int64)


class GymnasiumEnvs:
    """E Gymnasium envs built by :func:`make_env`, stepped in turn; env ``e`` is seeded ``seed + e``."""

    def __init__(self, env_id: str, options: EnvOptions, num_envs: int, seed: int | None, training: bool = True):
        self.envs = [make_env(env_id, options, seed=None if seed is None else seed + e, training=training)
                     for e in range(num_envs)]
        self.num_envs = num_envs
        self.observation_space = self.envs[0].observation_space
        self.action_space = self.envs[0].action_space
        self._seed = seed
        self._obs: np.ndarray | None = None

    def reset(self) -> np.ndarray:
        seeds = [None if self._seed is None else self._seed + e for e in range(self.num_envs)]
        self._obs = np.stack([env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)])
        return self._obs

    def step(self, action: np.ndarray) -> VectorStep:
        obs = self._obs
        reward = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        truncated = np.zeros(self.num_envs, bool)
        episode_return, episode_length = _no_episode_records(self.num_envs)
        final_obs: dict[int, np.ndarray] = {}
        for e, env in enumerate(self.envs):
            o, r, term, trunc, info = env.step(action[e])
            reward[e] = r
            terminated[e] = term
            truncated[e] = trunc and not term
            if term or trunc:
                if truncated[e]:
                    final_obs[e] = o
                # EpisodicLife's reset after a lost life steps the game, which may end it there.
                o, reset_info = env.reset()
                episode = info.get("episode", reset_info.get("episode"))
                if episode is not None:
                    episode_return[e] = episode["r"]
                    episode_length[e] = episode["l"]
            obs[e] = o
        return VectorStep(obs, reward, terminated, truncated, episode_return, episode_length, final_obs)

    def reward_stats(self) -> np.ndarray | None:
        normalizers = [_reward_normalizer(env) for env in self.envs]
        if normalizers[0] is None:
            return None
        return np.array([[n.return_rms.mean, n.return_rms.var, n.return_rms.count] for n in normalizers], np.float64)

    def set_reward_stats(self, stats: np.ndarray) -> None:
        for env, (mean, var, count) in zip(self.envs, stats):
            normalizer = _reward_normalizer(env)
            normalizer.return_rms.mean, normalizer.return_rms.var, normalizer.return_rms.count = mean, var, count

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _reward_normalizer(env: gym.Env) -> NormalizeReward | None:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, NormalizeReward):
            return env
        env = env.env
    return None


class EnvPoolEnvs:
    """One EnvPool of E envs on one thread (the actor process is the unit of parallelism).

    EnvPool resets an env on the step *after* its episode ends, ignoring that step's action; this
    class resets finished envs at once instead (a partial ``reset``), so the actor never acts on
    a terminal observation. EnvPool's own episodic life and reward clipping are off: lives are
    read from ``info["lives"]`` so that a game's return spans all its lives, and the losses clip
    rewards themselves (``reward_clip``). EnvPool's FIRE reset is off too: a reset and a lost life
    are followed by the FIRE step of :class:`PressFire` and a lost life then by the no-op step of
    :class:`EpisodicLife`, so both backends give the same frames; the one difference is that Atari
    episode lengths here count the agent's frames without the reset no-ops.
    """

    def __init__(self, env_id: str, options: EnvOptions, num_envs: int, seed: int | None, training: bool = True):
        import envpool

        task_id, kwargs = envpool_task(env_id, options)
        with warnings.catch_warnings():
            # EnvPool declares float64 Box bounds for float32 observations; Gymnasium warns about each.
            warnings.filterwarnings("ignore", message=".*precision lowered by casting", category=UserWarning)
            self.pool = envpool.make(task_id, env_type="gymnasium", num_envs=num_envs, batch_size=num_envs,
                                     num_threads=1, seed=0 if seed is None else seed, **kwargs)
            self.observation_space = self.pool.observation_space
            self.action_space = self.pool.action_space
        self.num_envs = num_envs
        space = self.action_space
        # A Gaussian policy samples outside the bounds; clip as make_env's ClipToBounds does.
        self._action_bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None
        atari = env_family(env_id) == "atari"
        self._episodic_life = atari and training and options.episodic_life
        self._fire = atari and options.fire_reset and game_waits_for_fire(env_id)
        self._frames_per_step = int(options.frame_skip) if atari else 1
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        self._lives = np.zeros(num_envs, np.int64)

    def reset(self) -> np.ndarray:
        obs, info = self.pool.reset()
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._lives[:] = info.get("lives", 0)
        self._fire_after_reset(np.arange(self.num_envs), obs)
        return obs

    def step(self, action: np.ndarray) -> VectorStep:
        if self._action_bounds is not None:
            action = np.clip(action, *self._action_bounds)
        obs, reward, game_over, truncated, info = self.pool.step(action)
        reward = np.asarray(reward, np.float32)
        truncated = truncated & ~game_over
        self._returns += reward
        self._lengths += 1
        terminated = game_over.copy()
        ended = game_over | truncated
        if self._episodic_life or self._fire:
            lost = (info["lives"] < self._lives) & ~ended
            self._lives[:] = info["lives"]
            if lost.any() and self._fire:
                fire_reward, fire_game_over, fire_truncated = self._step_envs(np.flatnonzero(lost), FIRE, obs)
                reward = reward + fire_reward
                terminated |= fire_game_over
                truncated |= fire_truncated
                ended |= fire_game_over | fire_truncated
                lost &= ~ended
            if lost.any() and self._episodic_life:
                # DeepMind's (and EpisodicLife's) no-op step, its reward the game's, not the training episode's
                terminated |= lost
                _, noop_game_over, noop_truncated = self._step_envs(np.flatnonzero(lost), 0, obs)
                ended |= noop_game_over | noop_truncated
        episode_return, episode_length = _no_episode_records(self.num_envs)
        final_obs = {int(e): obs[e].copy() for e in np.flatnonzero(truncated)}
        if ended.any():
            done = np.flatnonzero(ended)
            episode_return[done] = self._returns[done]
            episode_length[done] = self._lengths[done] * self._frames_per_step
            self._returns[done] = 0.0
            self._lengths[done] = 0
            self._reset_envs(done, obs)
            self._fire_after_reset(done, obs)
        return VectorStep(obs, reward, terminated, truncated, episode_return, episode_length, final_obs)

    def _reset_envs(self, env_ids: np.ndarray, obs: np.ndarray) -> None:
        reset_obs, reset_info = self.pool.reset(env_ids.astype(np.int32))
        order = reset_info["env_id"]
        obs[order] = reset_obs
        self._lives[order] = reset_info.get("lives", 0)

    def _fire_after_reset(self, env_ids: np.ndarray, obs: np.ndarray) -> None:
        """:class:`PressFire`'s reset: FIRE in the fresh games ``env_ids``; one its frame cap ended
        restarts without it."""
        if not self._fire:
            return
        _, game_over, truncated = self._step_envs(env_ids, FIRE, obs)
        capped = np.flatnonzero(game_over | truncated)
        if capped.size:
            self._returns[capped] = 0.0
            self._lengths[capped] = 0
            self._reset_envs(capped, obs)

    def _step_envs(self, env_ids: np.ndarray, action: int, obs: np.ndarray) -> tuple[np.ndarray, ...]:
        """One step with ``action`` of the envs ``env_ids`` (their observations in ``obs`` replaced,
        the reward counted in their games' returns): per env of the vector, the reward and whether
        the game ended or was truncated (zero and False for the others)."""
        step_obs, step_reward, game_over, truncated, info = self.pool.step(
            np.full(len(env_ids), action, np.int32), env_ids.astype(np.int32))
        order = info["env_id"]
        obs[order] = step_obs
        self._returns[order] += step_reward
        self._lengths[order] += 1
        self._lives[order] = info["lives"]
        reward, ended, cut = np.zeros(self.num_envs, np.float32), np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        reward[order], ended[order], cut[order] = step_reward, game_over, truncated & ~game_over
        return reward, ended, cut

    def reward_stats(self) -> np.ndarray | None:
        return None  # envpool_task refuses reward normalisation

    def set_reward_stats(self, stats: np.ndarray) -> None:
        raise ValueError("EnvPoolEnvs has no reward normalisation")

    def close(self) -> None:
        self.pool.close()


def envpool_task(env_id: str, options: EnvOptions) -> tuple[str, dict[str, object]]:
    """EnvPool's id and keyword arguments for ``env_id`` with ``options``, or a one-line
    :class:`UserError` when EnvPool is missing or cannot run this env the way :func:`make_env` does."""
    try:
        import envpool
    except ImportError:
        raise UserError("--env-backend envpool needs EnvPool: pip install envpool") from None
    if options.normalize_reward_gamma is not None:
        raise UserError("--env-backend envpool does not scale rewards; drop --normalize-rewards or use --env-backend gymnasium")
    family = env_family(env_id)
    spec = env_spec(env_id)
    kwargs: dict[str, object] = {}
    if family == "atari":
        if options.noop_max < 1:
            raise UserError("--env-backend envpool needs noop_max >= 1 (EnvPool crashes without reset no-ops)")
        game = _ale_game_name(spec)
        task_id = f"{game}-v5"
        sticky = options.sticky_action_prob
        if sticky is None:
            sticky = spec.kwargs.get("repeat_action_probability", 0.25)
        max_steps = options.max_episode_steps or ALE_MAX_FRAMES // int(options.frame_skip)
        kwargs = dict(frame_skip=int(options.frame_skip), stack_num=int(options.frame_stack),
                      noop_max=int(options.noop_max), img_height=int(options.screen_size),
                      img_width=int(options.screen_size), repeat_action_probability=float(sticky),
                      max_episode_steps=int(max_steps), episodic_life=False, reward_clip=False,
                      use_fire_reset=False, full_action_space=False, gray_scale=True)
    elif family == "classic":
        task_id = env_id
        if options.max_episode_steps is not None:
            kwargs["max_episode_steps"] = int(options.max_episode_steps)
    else:
        task_id = None
    if task_id is None or task_id not in envpool.list_all_envs():
        raise UserError(f"--env-backend envpool runs Atari and classic-control ids it provides, not {env_id!r}; "
                        "use --env-backend gymnasium")
    return task_id, kwargs


@functools.cache
def game_waits_for_fire(env_id: str) -> bool:
    """:func:`waits_for_fire` for the game of an ALE id, read from its Gymnasium env (EnvPool
    does not name its actions)."""
    register_all()
    env = gym.make(env_id)
    try:
        return waits_for_fire(env)
    finally:
        env.close()


def _ale_game_name(spec: gym.envs.registration.EnvSpec) -> str:
    """``ALE/Pong-v5`` and ``PongNoFrameskip-v4`` -> ``Pong`` (EnvPool names games like the v5 ids)."""
    name = spec.name
    return re.sub(r"(NoFrameskip|Deterministic)$", "", name)


def make_env_vector(env_id: str, options: EnvOptions, num_envs: int, *, seed: int | None = None,
                    backend: EnvBackend = "gymnasium", training: bool = True) -> EnvVector:
    """``num_envs`` envs of ``env_id`` on ``backend``; env ``e`` is seeded ``seed + e``."""
    if backend == "envpool":
        return EnvPoolEnvs(env_id, options, num_envs, seed, training)
    return GymnasiumEnvs(env_id, options, num_envs, seed, training)
