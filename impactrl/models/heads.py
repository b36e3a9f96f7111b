"""Policy and value heads.

A policy head maps features ``[..., F]`` to distribution parameters packed in ONE tensor
``[..., *params_shape]`` (logits for a categorical; a Gaussian head would pack mean and log-std)
and owns the distribution's maths, so losses and actors never assume an action type:

    params = head(features)
    actions = head.sample(params)               # [..., *action_shape], head.action_dtype
    logp = head.log_prob(params, actions)       # [...]

The maths is written directly (log_softmax, gather): ``torch.distributions`` validates its
arguments on every construction, which is slow in the learner's hot path.
"""

from __future__ import annotations

import abc

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["PolicyHead", "CategoricalHead", "ValueHead"]


class PolicyHead(nn.Module, abc.ABC):
    """Abstract policy head: features → distribution parameters, plus the distribution's maths.

    Attributes every subclass sets:
        action_shape: shape of one action (``()`` for discrete).
        action_dtype: dtype of actions (``torch.int64`` for discrete).
        params_shape: trailing shape of the parameter tensor (``(num_actions,)`` for categorical).
        action_encoding_size: size of ``encode_action``'s last dimension.
    """

    action_shape: tuple[int, ...]
    action_dtype: torch.dtype
    params_shape: tuple[int, ...]
    action_encoding_size: int

    @abc.abstractmethod
    def forward(self, features: Tensor) -> Tensor:
        """``[..., F]`` → parameters ``[..., *params_shape]``."""

    @abc.abstractmethod
    def sample(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw one action per batch entry: ``[..., *action_shape]``."""

    @abc.abstractmethod
    def mode(self, params: Tensor) -> Tensor:
        """The greedy action: ``[..., *action_shape]``."""

    @abc.abstractmethod
    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        """log π(actions) with the batch shape ``[...]``."""

    @abc.abstractmethod
    def entropy(self, params: Tensor) -> Tensor:
        """Entropy with the batch shape ``[...]``."""

    @abc.abstractmethod
    def kl(self, params_p: Tensor, params_q: Tensor) -> Tensor:
        """KL(p ‖ q) with the batch shape ``[...]``."""

    @abc.abstractmethod
    def encode_action(self, actions: Tensor) -> Tensor:
        """Float encoding ``[..., action_encoding_size]`` of actions (fed to a recurrent core)."""


def _finite_log_softmax(logits: Tensor) -> Tensor:
    # Clamping -inf (masked actions) to the most negative finite value keeps p·log p = 0, not NaN.
    logp = F.log_softmax(logits, dim=-1)
    return logp.clamp(min=torch.finfo(logp.dtype).min)


class CategoricalHead(PolicyHead):
    """Linear → logits over ``num_actions``; orthogonal init with gain 0.01, zero bias."""

    def __init__(self, input_size: int, num_actions: int) -> None:
        super().__init__()
        if num_actions < 1:
            raise ValueError(f"num_actions must be positive, got {num_actions}")
        self.num_actions = int(num_actions)
        self.linear = nn.Linear(int(input_size), self.num_actions)
        nn.init.orthogonal_(self.linear.weight, gain=0.01)
        nn.init.zeros_(self.linear.bias)
        self.action_shape = ()
        self.action_dtype = torch.int64
        self.params_shape = (self.num_actions,)
        self.action_encoding_size = self.num_actions

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features)

    def sample(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        probs = F.softmax(params, dim=-1).reshape(-1, self.num_actions)
        actions = torch.multinomial(probs, 1, generator=generator)
        return actions.reshape(params.shape[:-1])

    def mode(self, params: Tensor) -> Tensor:
        return params.argmax(dim=-1)

    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        logp = F.log_softmax(params, dim=-1)
        return logp.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)

    def entropy(self, params: Tensor) -> Tensor:
        logp = _finite_log_softmax(params)
        return -(logp.exp() * logp).sum(dim=-1)

    def kl(self, params_p: Tensor, params_q: Tensor) -> Tensor:
        logp = _finite_log_softmax(params_p)
        logq = _finite_log_softmax(params_q)
        return (logp.exp() * (logp - logq)).sum(dim=-1)

    def encode_action(self, actions: Tensor) -> Tensor:
        return F.one_hot(actions.long(), self.num_actions).to(torch.get_default_dtype())

    def extra_repr(self) -> str:
        return f"num_actions={self.num_actions}"


class ValueHead(nn.Module):
    """Linear → values; orthogonal init with gain 1, zero bias.

    Returns ``[...]`` when ``num_outputs == 1`` (last dim squeezed), else ``[..., num_outputs]``
    (e.g. one value per task for multi-task PopArt).
    """

    def __init__(self, input_size: int, num_outputs: int = 1) -> None:
        super().__init__()
        self.num_outputs = int(num_outputs)
        self.linear = nn.Linear(int(input_size), self.num_outputs)
        nn.init.orthogonal_(self.linear.weight, gain=1.0)
        nn.init.zeros_(self.linear.bias)

    def forward(self, features: Tensor) -> Tensor:
        v = self.linear(features)
        return v.squeeze(-1) if self.num_outputs == 1 else v
