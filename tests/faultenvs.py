"""CartPole variants that fail on purpose, for the fault tests (ids ``faultenvs:NAME``).

Each counts its own steps; the failures are real: exceptions, NaN rewards, a process exit, a hang.
"""

import os
import time
from pathlib import Path

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class FaultyCartPole(CartPoleEnv):
    def __init__(self, raise_every: int = 0, nan_every: int = 0, exit_every: int = 0, hang_once: bool = False,
                 broken_reset: bool = False, raise_in_episode_at: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.raise_every, self.nan_every, self.exit_every = raise_every, nan_every, exit_every
        self.hang_once, self.broken_reset, self.raise_in_episode_at = hang_once, broken_reset, raise_in_episode_at
        self.steps = self.episode_steps = 0

    def reset(self, **kwargs):
        if self.broken_reset:
            raise RuntimeError("this env cannot be reset")
        self.episode_steps = 0
        return super().reset(**kwargs)

    def step(self, action):
        self.steps += 1
        self.episode_steps += 1
        if self.episode_steps == self.raise_in_episode_at:
            raise ValueError(f"simulated env failure at step {self.episode_steps} of the episode")
        if self.raise_every and self.steps % self.raise_every == 0:
            raise RuntimeError(f"simulated env failure at step {self.steps}")
        if self.exit_every and self.steps % self.exit_every == 0:
            os._exit(3)
        if self.hang_once and self.steps == 50 and _first_to_claim("hang"):
            time.sleep(3600)
        obs, reward, terminated, truncated, info = super().step(action)
        if self.nan_every and self.steps % self.nan_every == 0:
            reward = float("nan")
        return obs, reward, terminated, truncated, info


def _first_to_claim(name: str) -> bool:
    """True in exactly one process of a test (the marker directory comes from the test)."""
    try:
        (Path(os.environ["IMPACTRL_TEST_MARKERS"]) / name).open("x").close()
        return True
    except FileExistsError:
        return False


for name, kwargs in {
    "RaisingCartPole-v0": {"raise_every": 700},
    "BrokenResetCartPole-v0": {"broken_reset": True},
    "StepTenRaisesCartPole-v0": {"raise_in_episode_at": 10},
    "SometimesNaNCartPole-v0": {"nan_every": 3000},
    "NaNCartPole-v0": {"nan_every": 1},
    "CrashingCartPole-v0": {"exit_every": 400},
    "HangingCartPole-v0": {"hang_once": True},
}.items():
    if name not in gym.registry:
        gym.register(name, entry_point=FaultyCartPole, kwargs=kwargs, max_episode_steps=500)
