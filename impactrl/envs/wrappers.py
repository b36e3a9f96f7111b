"""Small Gymnasium wrappers that :func:`impactrl.envs.make_env` composes.

- :class:`HideVelocity` — CartPole with its two velocity entries hidden (a POMDP for LSTM agents).
- :class:`ChannelsFirstUint8` — MinAtar's ``(10, 10, C)`` bool grid as a ``(C, 10, 10)`` uint8 array.
- :class:`PressFire` — FIRE pressed after each reset and lost life, for Atari games that wait for it.
- :class:`EpisodicLife` — DeepMind's "end of life is end of episode" for *training* on Atari.
- :class:`ClipToBounds` — continuous actions clipped into the env's bounds, which it still announces.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = ["HideVelocity", "ChannelsFirst", "ChannelsFirstUint8", "EpisodicLife", "ClipToBounds",
           "make_cartpole_no_velocity"]


class HideVelocity(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """CartPole observation ``[x, x_dot, theta, theta_dot]`` → ``[x, theta]`` (float32, shape (2,))."""

    KEEP = (0, 2)  # cart position, pole angle

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        inner = env.observation_space
        assert isinstance(inner, spaces.Box) and inner.shape == (4,), inner
        keep = list(self.KEEP)
        self.observation_space = spaces.Box(
            low=inner.low[keep], high=inner.high[keep], shape=(2,), dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[list(self.KEEP)]


def make_cartpole_no_velocity(**kwargs: Any) -> gym.Env:
    """Entry point of ``impactrl/CartPoleNoVelocity-v1`` (kwargs go to ``CartPoleEnv``)."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return HideVelocity(CartPoleEnv(**kwargs))


# ``gym.make`` reads ``entry_point.metadata`` to validate ``render_mode``.
make_cartpole_no_velocity.metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 50}  # type: ignore[attr-defined]


class ChannelsFirst(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """``(H, W, C)`` Box observation → ``(C, H, W)``, dtype and bounds kept (``--image-layout hwc``)."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        inner = env.observation_space
        self.observation_space = spaces.Box(np.moveaxis(np.broadcast_to(inner.low, inner.shape), -1, 0),
                                            np.moveaxis(np.broadcast_to(inner.high, inner.shape), -1, 0),
                                            dtype=inner.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.moveaxis(observation, -1, 0))


class ChannelsFirstUint8(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """``(H, W, C)`` bool/0-1 observation → ``(C, H, W)`` uint8 in {0, 1} (MinAtar)."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ObservationWrapper.__init__(self, env)
        inner = env.observation_space
        assert isinstance(inner, spaces.Box) and len(inner.shape) == 3, inner
        h, w, c = inner.shape
        self.observation_space = spaces.Box(low=0, high=1, shape=(c, h, w), dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(np.asarray(observation, dtype=np.uint8), (2, 0, 1)))


class ClipToBounds(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Box actions clipped into the env's bounds (a Gaussian policy samples outside them), the action
    space kept: Gymnasium's ClipAction announces (-inf, inf) instead, hiding the bounds from the
    agent (``squash_actions``) and from the messages that name the space."""

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.ActionWrapper.__init__(self, env)

    def action(self, action: np.ndarray) -> np.ndarray:
        return np.clip(action, self.action_space.low, self.action_space.high)


FIRE = 1  # ALE's action 1 in the minimal action set of every game that has FIRE


def waits_for_fire(env: gym.Env) -> bool:
    """Whether the Atari game's action 1 is FIRE, the press that Breakout and others wait for to
    (re)start play."""
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) > FIRE and meanings[FIRE] == "FIRE"


class PressFire(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """FIRE is pressed after each reset and right after each lost life (baselines' FireResetEnv,
    extended to lives): Breakout and others wait for it, and an agent that stops pressing it holds
    the game still until the frame cap ends it, while its value and entropy losses see nothing happen.

    The FIRE step is one more agent step: its reward joins the step it follows (the step that lost
    the life), its frames join the game's statistics; at reset its reward (always 0) is dropped.
    Place it inside :class:`EpisodicLife`, which then ends the training episode on that step.
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self._lives = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self._lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(FIRE)
            reward += fire_reward
            lives = self.env.unwrapped.ale.lives()
        self._lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, _ = self.env.step(FIRE)
        if terminated or truncated:  # a frame cap shorter than the reset no-ops: start without FIRE
            obs, info = self.env.reset()
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info


class EpisodicLife(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """A life loss ends the *training* episode; the game goes on (DeepMind / baselines style).

    ``step`` returns ``terminated=True`` when ``ale.lives()`` dropped and the game is not over.
    The ``reset`` that follows such a step does not reset the game: it takes one no-op step
    (action 0) and returns that observation (its reward is dropped, as in DeepMind's code). The
    game is really reset when it is over (terminated or truncated), when ``reset`` is called
    without a preceding life loss, or when ``seed``/``options`` are given.

    Place it *outside* ``RecordEpisodeStatistics``: the statistics then describe whole games, so
    ``info["episode"]`` is absent on a life loss and holds the full-game return at game over.
    In the rare case where the no-op step of a life-loss reset itself ends the game, the game is
    reset for real and that step's ``info["episode"]`` is passed on in the reset's info.
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)
        self._lives = 0
        self._life_lost = False  # the last step ended the training episode, not the game

    @property
    def ale(self):
        return self.env.unwrapped.ale

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.ale.lives()
        game_over = terminated or truncated
        self._life_lost = (not game_over) and lives < self._lives
        self._lives = lives
        return obs, reward, terminated or self._life_lost, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self._life_lost and seed is None and options is None:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                episode = info.get("episode")
                obs, info = self.env.reset()
                if episode is not None:
                    info = {**info, "episode": episode}
        else:
            obs, info = self.env.reset(seed=seed, options=options)
        self._life_lost = False
        self._lives = self.ale.lives()
        return obs, info
