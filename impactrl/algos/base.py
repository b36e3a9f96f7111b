"""What the learner loop needs from an algorithm: a loss, the optimiser and a batch buffer.

The learner loop (``impactrl.runtime.learner``) is the same for every algorithm::

    if algorithm.wants_data():                 # IMPALA: nothing pending; IMPACT: buffer not full
        algorithm.add_batch(source.next_batch())
    elif algorithm.takes_ready_data():         # IMPACT --buffer-fetch ready
        algorithm.add_batch(source.next_batch()) if one is ready now
    train_batch = algorithm.next_batch()       # None: wait for more data
    loss, stats, extras = algorithm.loss(train_batch)  # one SGD step per batch drawn
    optimiser step; algorithm.after_update(updates, extras, taken)  # taken: False for a skipped step
    if algorithm.publish_now(): publish weights with version = updates

IMPALA trains on each batch once, IMPACT draws from a circular buffer (each batch K times),
PPO cuts each batch into minibatches for several epochs and publishes only after the last.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal, NamedTuple

import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch
from impactrl.models import Agent
from impactrl.ops.rmsprop import RMSpropTF, RMSpropTorch
from impactrl.runtime.distributed import LearnerGroup


def optimizer_settings(config: TrainConfig) -> dict[str, float]:
    """The optimiser's hyperparameters besides the learning rate (which the learner sets at every
    step, annealed) as the config sets them: at construction, and again over the values a loaded
    optimiser state brings (a resumed run's or an exploited trial's changed setting wins)."""
    if config.optimizer == "adam":
        return {"eps": config.adam_eps}
    return {"alpha": config.rmsprop_alpha, "eps": config.rmsprop_eps, "momentum": config.rmsprop_momentum}


# Adam's kernel that reads found_inf (GradScaler's path); set again over a loaded state's flags.
FUSED_ADAM = {"fused": True, "foreach": None}


def make_optimizer(config: TrainConfig, parameters) -> torch.optim.Optimizer:
    """The config's optimiser, one that reads ``found_inf`` (a 0-dim device tensor, 1: leave
    parameters and state as they are) so that a non-finite step is skipped without a host sync."""
    settings = {"lr": config.learning_rate, **optimizer_settings(config)}
    if config.optimizer == "adam":
        return torch.optim.Adam(parameters, **settings, **FUSED_ADAM)
    if config.optimizer == "rmsprop_tf":
        return RMSpropTF(parameters, **settings)
    return RMSpropTorch(parameters, **settings)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict, config: TrainConfig) -> None:
    """A checkpoint's optimiser state into ``make_optimizer``'s optimiser, whatever wrote it: the
    config's settings and the fused implementation win over the saved ones (a checkpoint from
    before fused Adam carries foreach Adam's flags, and its step counts on the CPU)."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group.update(optimizer_settings(config))
        if config.optimizer == "adam":
            group.update(FUSED_ADAM)
            for param in group["params"]:
                if "step" in optimizer.state.get(param, {}):
                    optimizer.state[param]["step"] = optimizer.state[param]["step"].to(param.device, torch.float32)


@dataclass(frozen=True)
class LossExtras:
    """What a loss hands to ``after_update`` besides the loss, used there only where the step
    was taken, so a skipped one (non-finite loss or gradient) leaves no trace."""

    value_targets: tuple[torch.Tensor, torch.Tensor] | None = None  # PopArt: V-trace targets and their tasks
    kl: torch.Tensor | None = None  # IMPACT with a target network: KL(π_tgt ‖ π_θ) on the batch


class LossResult(NamedTuple):
    loss: torch.Tensor  # the scalar to minimise
    stats: dict[str, torch.Tensor | float]  # to log: tensors stay on the device (no sync per step)
    extras: LossExtras  # for after_update


class Algorithm(ABC):
    # How the loss reduces over the batch's steps: "sum" (IMPALA, as the paper) or "mean". Several
    # learners reduce their gradients the same way, so that N shards step as the whole batch would.
    loss_reduction: ClassVar[Literal["sum", "mean"]]
    # The keys of ``state_dict`` that hold this learner's own data (a pending batch, a buffer), which
    # with several learners differ between them and are checkpointed per learner.
    local_state_keys: ClassVar[tuple[str, ...]]

    def __init__(self, config: TrainConfig, agent: Agent):
        self.config = config
        self.agent = agent
        self.group = LearnerGroup()  # the learners this one trains with (set by Learner.join)
        self._pending: Batch | None = None

    @abstractmethod
    def loss(self, batch: Batch) -> LossResult:
        """The scalar loss to minimise on one batch, statistics to log and what ``after_update``
        needs; no side effects, since the learner may skip the update."""

    def wants_data(self) -> bool:
        """Whether the learner should wait for a fresh batch before the next SGD step."""
        return self._pending is None

    def owes_updates(self) -> bool:
        """Whether data already taken is still to be trained on (the run ends only once it is)."""
        return not self.wants_data()

    def takes_ready_data(self) -> bool:
        """Whether the learner should also take a batch that is ready now when it need not wait for one."""
        return False

    def add_batch(self, batch: Batch) -> None:
        """Take a fresh batch from the actors (the default trains on it exactly once)."""
        self._pending = batch

    def next_batch(self) -> Batch | None:
        """The next batch to take an SGD step on, or None to wait for fresh data."""
        batch, self._pending = self._pending, None
        return batch

    def after_update(self, updates: int, extras: LossExtras, taken: torch.Tensor) -> dict[str, torch.Tensor | float]:
        """Called after every optimiser step, with the learner's update count, the extras of the
        loss it stepped on and whether the step was taken (a 0-dim bool on the device: a skipped
        step must leave no trace, decided without reading it); returns stats. With PopArt, moves
        the value statistics to the targets the step trained on."""
        if extras.value_targets is None:
            return {}
        head = self.agent.value_head
        head.update(*extras.value_targets, reduce=self.group.sum, taken=taken)
        return {"popart/mu_mean": head.mu.mean(), "popart/sigma_mean": head.sigma().mean()}

    def publish_now(self) -> bool:
        """Whether actors should get the weights after this update (PPO: only after the last epoch)."""
        return True

    def state_dict(self) -> dict:
        """Algorithm state beyond the agent and optimiser, saved in checkpoints (tensors and plain types)."""
        return {"pending": self._pending}

    def load_state_dict(self, state: dict) -> None:
        pending = state["pending"]
        device = next(self.agent.parameters()).device
        self._pending = None if pending is None else {key: value.to(device) for key, value in pending.items()}
