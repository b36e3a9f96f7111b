"""What the learner loop needs from an algorithm: a loss, its optimiser and its batch buffer.

The learner loop (``impactrl.runtime.learner``) is the same for every algorithm::

    algorithm.add_batch(batch)                       # a fresh batch from the actors
    while (train_batch := algorithm.next_batch()) is not None:
        loss, stats = algorithm.loss(train_batch)    # one SGD step per batch drawn
        optimiser step
        algorithm.after_update(update_count)         # e.g. refresh a target network

IMPALA trains on each batch once; IMPACT draws from a circular buffer several times.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch
from impactrl.models import Agent


class Algorithm(ABC):
    def __init__(self, config: TrainConfig, agent: Agent):
        self.config = config
        self.agent = agent
        self._pending: Batch | None = None

    @abstractmethod
    def make_optimizer(self) -> torch.optim.Optimizer:
        """The optimiser over the agent's parameters, with the algorithm's defaults."""

    @abstractmethod
    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss to minimise on one batch, and statistics to log."""

    def add_batch(self, batch: Batch) -> None:
        """Take a fresh batch from the actors (the default trains on it exactly once)."""
        self._pending = batch

    def next_batch(self) -> Batch | None:
        """The next batch to take an SGD step on, or None to wait for fresh data."""
        batch, self._pending = self._pending, None
        return batch

    def after_update(self, updates: int) -> None:
        """Called after every optimiser step with the learner's update count."""

    def state_dict(self) -> dict:
        """Algorithm state beyond the agent and optimiser, saved in checkpoints."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
