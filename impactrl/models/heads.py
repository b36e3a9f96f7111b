"""Policy and value heads.

A policy head maps features ``[..., F]`` to distribution parameters packed in ONE tensor
``[..., *params_shape]`` (logits for a categorical; mean and log-std for a Gaussian)
and owns the distribution's maths, so losses and actors never assume an action type:

    params = head(features)
    actions = head.sample(params)               # [..., *action_shape], head.action_dtype
    logp = head.log_prob(params, actions)       # [...]

The maths is written directly (log_softmax, gather): ``torch.distributions`` validates its
arguments on every construction, which is slow in the learner's hot path.
"""

from __future__ import annotations

import abc
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from impactrl.ops.popart import art_update, pop_preserve, popart_sigma

__all__ = ["PolicyHead", "CategoricalHead", "TaskCategoricalHead", "GaussianHead", "ValueHead", "PopArtValueHead"]


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

    def sample_with_log_prob(self, params: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``(sample(params), log_prob(params, that sample))``; heads may share work between them."""
        actions = self.sample(params, generator)
        return actions, self.log_prob(params, actions)

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
        return self.sample_with_log_prob(params, generator)[0]

    def sample_with_log_prob(self, params: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        # Gumbel-max: argmax_a p_a / E_a with E_a ~ Exp(1) is a draw from p (argmax of
        # log p_a + Gumbel noise). It reuses the log-softmax the log-prob needs and costs
        # half of softmax + torch.multinomial per actor step on a CPU.
        logp = F.log_softmax(params, dim=-1)
        # A zero draw would make a masked action's 0 / 0 a NaN that argmax picks.
        noise = torch.empty_like(logp).exponential_(generator=generator).clamp_(min=torch.finfo(logp.dtype).tiny)
        actions = (logp.exp() / noise).argmax(dim=-1)
        return actions, logp.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

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


class TaskCategoricalHead(CategoricalHead):
    """Logits per task over one shared feature vector, for a multi-task agent.

    One linear layer computes every task's logits; each entry keeps its own task's (a gather, so a
    task's loss sends exactly zero gradient into the other tasks' rows). Tasks have different
    action counts: the logits of actions a task does not have are −inf, so those actions are
    never sampled and have probability 0 (log-prob −inf) in every loss.
    """

    def __init__(self, input_size: int, task_num_actions: tuple[int, ...]) -> None:
        super().__init__(input_size, max(task_num_actions))
        self.task_num_actions = tuple(int(n) for n in task_num_actions)
        num_tasks, num_actions = len(self.task_num_actions), self.num_actions
        self.linear = nn.Linear(int(input_size), num_tasks * num_actions)
        nn.init.orthogonal_(self.linear.weight, gain=0.01)
        nn.init.zeros_(self.linear.bias)
        invalid = torch.arange(num_actions)[None, :] >= torch.tensor(self.task_num_actions)[:, None]
        self.register_buffer("invalid", invalid, persistent=False)  # [num_tasks, num_actions]

    def forward(self, features: Tensor, task: Tensor | None = None) -> Tensor:
        """``[..., F]`` and the task of each entry ``[...]`` (None: task 0) → logits ``[..., A]``."""
        logits = self.linear(features).unflatten(-1, (len(self.task_num_actions), self.num_actions))
        if task is None:
            task = torch.zeros(logits.shape[:-2], dtype=torch.int64, device=logits.device)
        index = task.unsqueeze(-1).unsqueeze(-1).expand(*task.shape, 1, self.num_actions)
        logits = logits.gather(-2, index).squeeze(-2)
        return logits.masked_fill(self.invalid[task], float("-inf"))

    def extra_repr(self) -> str:
        return f"task_num_actions={self.task_num_actions}"


_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_LOG_2 = math.log(2.0)
SQUASH_ATANH_LIMIT = 1.0 - 1e-6


class GaussianHead(PolicyHead):
    """Diagonal Gaussian over ``action_size`` continuous actions (CleanRL's MuJoCo PPO head).

    A Linear gives the mean (orthogonal init with gain 0.01, zero bias); the log-std is one
    learnable, **state-independent** ``nn.Parameter`` of shape ``[action_size]`` initialised to
    ``log_std_init``. ``forward`` packs ``params = concat(mean, log_std)`` into one tensor
    ``[..., 2 * action_size]`` (the log-std broadcast over the batch, so gradients reach it
    through the params). ``log_prob`` and ``entropy`` sum over the action dimension.

    Without ``squash`` actions are the raw Gaussian samples (unbounded; clip them in the env).

    With ``squash=True`` an action is ``a = loc + scale · tanh(u)``, ``u ~ N(mean, std)``, with
    ``loc = (high + low) / 2`` and ``scale = (high - low) / 2`` (``action_low`` / ``action_high``,
    default −1 / 1), so samples lie in ``[low, high]``. Then:

    * ``log_prob(params, a)`` inverts the squash, ``u = atanh(clamp((a - loc) / scale,
      ±(1 − 1e-6)))``, and returns ``log N(u) − log(1 − tanh²u) − log scale`` summed over the
      action dimension, using ``log(1 − tanh²u) = 2·(log 2 − u − softplus(−2u))``. Actions
      on (or numerically at) the bounds are clamped first, so their log-prob is finite.
    * ``entropy`` is the entropy of the underlying Gaussian ``N(mean, std)`` — the squashed
      distribution's entropy has no closed form (it differs by ``E[log |da/du|]``).
    * ``kl`` is exact: KL is invariant under the same bijection applied to both distributions.
    * ``mode`` is ``loc + scale · tanh(mean)`` (the squashed mean, the usual greedy action).
    """

    def __init__(
        self,
        input_size: int,
        action_size: int,
        *,
        log_std_init: float = 0.0,
        squash: bool = False,
        action_low: Tensor | float | None = None,
        action_high: Tensor | float | None = None,
    ) -> None:
        super().__init__()
        if action_size < 1:
            raise ValueError(f"action_size must be positive, got {action_size}")
        self.action_size = int(action_size)
        self.squash = bool(squash)
        self.linear = nn.Linear(int(input_size), self.action_size)
        nn.init.orthogonal_(self.linear.weight, gain=0.01)
        nn.init.zeros_(self.linear.bias)
        self.log_std = nn.Parameter(torch.full((self.action_size,), float(log_std_init)))
        self.action_shape = (self.action_size,)
        self.action_dtype = torch.float32
        self.params_shape = (2 * self.action_size,)
        self.action_encoding_size = self.action_size
        if self.squash:
            low = torch.as_tensor(-1.0 if action_low is None else action_low, dtype=torch.float32)
            high = torch.as_tensor(1.0 if action_high is None else action_high, dtype=torch.float32)
            low = low.expand(self.action_size).clone()
            high = high.expand(self.action_size).clone()
            if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (high > low).all()):
                raise ValueError(f"squash needs finite bounds with low < high, got low={low}, high={high}")
            # Constants of the action space, not learned state: kept out of the state_dict.
            self.register_buffer("action_low", low, persistent=False)
            self.register_buffer("action_high", high, persistent=False)
            self.register_buffer("action_loc", (high + low) / 2, persistent=False)
            self.register_buffer("action_scale", (high - low) / 2, persistent=False)

    def forward(self, features: Tensor) -> Tensor:
        mean = self.linear(features)
        return torch.cat([mean, self.log_std.to(mean.dtype).expand_as(mean)], dim=-1)

    def split(self, params: Tensor) -> tuple[Tensor, Tensor]:
        """``params`` → ``(mean, log_std)``, each ``[..., action_size]``."""
        return params[..., : self.action_size], params[..., self.action_size :]

    def _squash(self, u: Tensor) -> Tensor:
        loc, scale = self.action_loc.to(u.dtype), self.action_scale.to(u.dtype)
        a = loc + scale * torch.tanh(u)
        # Rounding in loc + scale·(±1) may step just past a bound.
        return torch.minimum(torch.maximum(a, self.action_low.to(u.dtype)), self.action_high.to(u.dtype))

    @torch.no_grad()
    def sample(self, params: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Sampled actions carry no gradient (like the categorical's; no reparameterisation)."""
        mean, log_std = self.split(params)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype, device=mean.device)
        u = mean + log_std.exp() * noise
        return self._squash(u) if self.squash else u

    def mode(self, params: Tensor) -> Tensor:
        mean, _ = self.split(params)
        return self._squash(mean) if self.squash else mean

    def log_prob(self, params: Tensor, actions: Tensor) -> Tensor:
        mean, log_std = self.split(params)
        a = actions.to(mean.dtype)
        if self.squash:
            loc, scale = self.action_loc.to(mean.dtype), self.action_scale.to(mean.dtype)
            y = ((a - loc) / scale).clamp(-SQUASH_ATANH_LIMIT, SQUASH_ATANH_LIMIT)
            u = torch.atanh(y)
        else:
            u = a
        z = (u - mean) * torch.exp(-log_std)
        logp = -0.5 * z.square() - log_std - _HALF_LOG_2PI
        if self.squash:
            log_det_tanh = 2.0 * (_LOG_2 - u - F.softplus(-2.0 * u))  # log(1 - tanh(u)^2)
            logp = logp - log_det_tanh - torch.log(scale)
        return logp.sum(dim=-1)

    def entropy(self, params: Tensor) -> Tensor:
        """Entropy of ``N(mean, std)`` summed over actions; with squash, of the UNsquashed Gaussian."""
        _, log_std = self.split(params)
        return (log_std + (0.5 + _HALF_LOG_2PI)).sum(dim=-1)

    def kl(self, params_p: Tensor, params_q: Tensor) -> Tensor:
        mean_p, log_std_p = self.split(params_p)
        mean_q, log_std_q = self.split(params_q)
        var_ratio = torch.exp(2.0 * (log_std_p - log_std_q))
        mahalanobis = ((mean_p - mean_q) * torch.exp(-log_std_q)).square()
        return (log_std_q - log_std_p + 0.5 * (var_ratio + mahalanobis - 1.0)).sum(dim=-1)

    def encode_action(self, actions: Tensor) -> Tensor:
        return actions.to(torch.get_default_dtype())

    def extra_repr(self) -> str:
        return f"action_size={self.action_size}, squash={self.squash}"


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


class PopArtValueHead(nn.Module):
    """Normalised values per task with PopArt statistics (``impactrl.ops.popart``).

    ``forward`` returns the normalised values ``n(x)`` ``[..., num_tasks]``; ``unnormalize`` maps a
    task's normalised value to ``V = σ n + μ``. The statistics ``mu`` and ``nu`` are buffers: they
    travel with the weights to the actors and into checkpoints. Only ``update`` changes them
    (ART), rewriting the linear layer at the same time so that every ``V`` is preserved (POP).
    """

    def __init__(self, input_size: int, num_tasks: int, beta: float, sigma_min: float = 1e-4,
                 sigma_max: float = 1e6) -> None:
        super().__init__()
        self.num_outputs = int(num_tasks)
        self.beta, self.sigma_min, self.sigma_max = float(beta), float(sigma_min), float(sigma_max)
        self.linear = nn.Linear(int(input_size), self.num_outputs)
        nn.init.orthogonal_(self.linear.weight, gain=1.0)
        nn.init.zeros_(self.linear.bias)
        self.register_buffer("mu", torch.zeros(self.num_outputs))
        self.register_buffer("nu", torch.ones(self.num_outputs))

    def forward(self, features: Tensor) -> Tensor:
        return self.linear(features)

    def sigma(self) -> Tensor:
        return popart_sigma(self.mu, self.nu, self.sigma_min, self.sigma_max)

    def unnormalize(self, normalized: Tensor, task: Tensor | None) -> Tensor:
        """``V = σ_task · n + μ_task`` for ``normalized`` ``[...]`` and ``task`` ``[...]`` (None: task 0)."""
        mu, sigma = self.statistics(task, normalized.shape)
        return sigma * normalized.float() + mu

    def statistics(self, task: Tensor | None, shape: torch.Size) -> tuple[Tensor, Tensor]:
        """``(μ, σ)`` of each entry's task, broadcast to ``shape``."""
        if task is None:
            return self.mu[0].expand(shape), self.sigma()[0].expand(shape)
        return self.mu[task], self.sigma()[task]

    @torch.no_grad()
    def update(self, targets: Tensor, task: Tensor | None,
               reduce: Callable[[Tensor], Tensor] = lambda sums: sums, taken: Tensor | None = None) -> None:
        """ART on the value targets ``targets`` of tasks ``task`` (same shape; None: task 0), then POP;
        ``reduce`` sums the targets' moments over several learners (``art_update``). Where ``taken``
        (a 0-dim bool tensor) is False nothing changes, decided on the device."""
        if task is None:
            task = torch.zeros(targets.shape, dtype=torch.int64, device=targets.device)
        sigma = self.sigma()
        mu, nu = art_update(self.mu, self.nu, targets.float(), task, self.beta, reduce)
        new_sigma = popart_sigma(mu, nu, self.sigma_min, self.sigma_max)
        weight, bias = pop_preserve(self.linear.weight, self.linear.bias, self.mu, sigma, mu, new_sigma)
        for current, new in ((self.linear.weight, weight), (self.linear.bias, bias), (self.mu, mu), (self.nu, nu)):
            current.copy_(new if taken is None else torch.where(taken, new, current))

    def extra_repr(self) -> str:
        return f"num_tasks={self.num_outputs}, beta={self.beta}"
