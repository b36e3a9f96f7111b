"""Envs whose spaces the agent cannot take, for the misuse tests, and one whose episodes never end
(ids ``oddenvs:NAME``)."""

import gymnasium as gym
import numpy as np


class OddSpaces(gym.Env):
    """An env with the given spaces; every episode is one step long."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space):
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, True, False, {}


VECTOR = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
for name, observation_space, action_space in [
    ("DictObservations-v0", gym.spaces.Dict({"position": VECTOR, "goal": gym.spaces.Discrete(3)}), gym.spaces.Discrete(2)),
    ("TupleObservations-v0", gym.spaces.Tuple((VECTOR, gym.spaces.Discrete(3))), gym.spaces.Discrete(2)),
    ("TextObservations-v0", gym.spaces.Text(8), gym.spaces.Discrete(2)),
    ("GridActions-v0", VECTOR, gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32)),
]:
    if name not in gym.registry:
        gym.register(name, entry_point=OddSpaces, kwargs={"observation_space": observation_space,
                                                          "action_space": action_space})


class Endless(gym.Env):
    """A point that drifts with its action (two of them) and earns 1 a step; no episode ever ends,
    and no time limit is registered."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.normal(size=4).astype(np.float32)
        return self.position.copy(), {}

    def step(self, action):
        self.position = np.tanh(self.position + (0.1 if action else -0.1)).astype(np.float32)
        return self.position.copy(), 1.0, False, False, {}


if "Endless-v0" not in gym.registry:
    gym.register("Endless-v0", entry_point=Endless)
