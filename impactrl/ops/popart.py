r"""PopArt: adaptive normalisation of value targets per task (Hessel et al. 2019, arXiv 1809.04474;
van Hasselt et al. 2016, arXiv 1602.07714; docs/algorithms.md#popart).

Per task i the statistics are the first and second moments μ_i, ν_i of the value targets, and

    σ_i = clamp( sqrt(ν_i − μ_i²), σ_min, σ_max ).

The value head outputs a *normalised* value n_i(x) = w_iᵀ h(x) + b_i; the value is
V_i(x) = σ_i n_i(x) + μ_i.

ART, after each learner update, from the batch's V-trace targets v of task i only:

    μ_i' = (1 − β) μ_i + β · mean(v),    ν_i' = (1 − β) ν_i + β · mean(v²).

POP, with the same update, rewrites the last layer so that V_i(x) is unchanged for every x:

    w_i' = (σ_i / σ_i') w_i,    b_i' = (σ_i b_i + μ_i − μ_i') / σ_i'.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["popart_sigma", "art_update", "pop_preserve"]


def popart_sigma(mu: Tensor, nu: Tensor, sigma_min: float, sigma_max: float) -> Tensor:
    """σ = clamp(sqrt(ν − μ²), σ_min, σ_max), elementwise over tasks (ν − μ² is floored at 0)."""
    return (nu - mu.square()).clamp(min=0.0).sqrt().clamp(sigma_min, sigma_max)


def art_update(mu: Tensor, nu: Tensor, targets: Tensor, task: Tensor, beta: float,
               reduce: Callable[[Tensor], Tensor] = lambda sums: sums) -> tuple[Tensor, Tensor]:
    """ART: ``(μ', ν')`` after moving each task's moments towards its targets' by ``β``.

    ``mu``, ``nu``: ``[K]``; ``targets`` and ``task`` (int64 in ``[0, K)``): the same shape, any.
    A task with no target in the batch keeps its statistics. ``reduce`` sums the per-task count,
    sum and sum of squares ``[3, K]`` over several learners' shards of the batch, so that every
    learner moves to the whole batch's moments.
    """
    K = mu.shape[0]
    task = task.reshape(-1)
    targets = targets.reshape(-1).to(mu.dtype)
    sums = torch.zeros(3, K, dtype=mu.dtype, device=mu.device)
    sums[0].index_add_(0, task, torch.ones_like(targets))
    sums[1].index_add_(0, task, targets)
    sums[2].index_add_(0, task, targets.square())
    count, first, second = reduce(sums)
    present = count > 0
    step = torch.where(present, torch.full_like(mu, beta), torch.zeros_like(mu))
    denominator = count.clamp(min=1.0)
    return (1 - step) * mu + step * first / denominator, (1 - step) * nu + step * second / denominator


def pop_preserve(weight: Tensor, bias: Tensor, mu: Tensor, sigma: Tensor, new_mu: Tensor,
                 new_sigma: Tensor) -> tuple[Tensor, Tensor]:
    """POP: the last layer ``(w', b')`` (``[K, F]``, ``[K]``) whose unnormalised outputs under
    ``(new_mu, new_sigma)`` equal those of ``(weight, bias)`` under ``(mu, sigma)``."""
    scale = sigma / new_sigma
    return weight * scale.unsqueeze(-1), (sigma * bias + mu - new_mu) / new_sigma
