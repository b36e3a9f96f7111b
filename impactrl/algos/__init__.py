"""Algorithms: a loss, its optimiser and its batch buffer (see ``impactrl.algos.base``)."""

from impactrl.algos.base import Algorithm
from impactrl.algos.impact import Impact
from impactrl.algos.impala import Impala
from impactrl.algos.ppo import PPO
from impactrl.config import TrainConfig
from impactrl.models import Agent

ALGORITHMS: dict[str, type[Algorithm]] = {"impala": Impala, "impact": Impact, "ppo": PPO}


def make_algorithm(config: TrainConfig, agent: Agent) -> Algorithm:
    return ALGORITHMS[config.algo](config, agent)


__all__ = ["Algorithm", "Impala", "Impact", "PPO", "ALGORITHMS", "make_algorithm"]
