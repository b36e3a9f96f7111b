r"""Generalized advantage estimation (GAE).

Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", arXiv 1506.02438, eq. (16) (the GAE(γ, λ) estimator), as used by PPO
(docs/algorithms.md#gae).

Shapes (time-major)
-------------------
=====================  ==========  ==========================================================
name                   shape       meaning
=====================  ==========  ==========================================================
``rewards``            [T, B]      r_t, the reward that followed a_t
``values``             [T, B]      V(x_t)
``bootstrap_value``    [B]         V(x_T), the value of the observation after the unroll
``discounts``          [T, B]      γ_t; multiplies V(x_{t+1}) and the recursion (0 at an episode
                                   end)
=====================  ==========  ==========================================================

Same time-index convention as :mod:`impactrl.ops.vtrace`: index ``t`` refers to the transition
``(x_t, a_t, r_t, γ_t, x_{t+1})`` and ``bootstrap_value`` plays the role of ``values[T]``.
Extra trailing dims are allowed (``[T, B, ...]``): ``rewards`` has exactly the shape of
``values``, ``bootstrap_value`` that of ``values[0]``, and ``discounts`` the rank of ``values``
with each dim equal or 1.

Maths
-----
    δ_t = r_t + γ_t · V(x_{t+1}) − V(x_t),          V(x_T) := bootstrap_value,
    Â_T = 0,
    Â_t = δ_t + γ_t · λ · Â_{t+1}                  for t = T−1, …, 0,
    R_t = Â_t + V(x_t)                             (the value targets, "returns").

This is eq. (16), Â_t = Σ_l (γλ)^l δ_{t+l}, cut where γ_t = 0. λ = 1 gives the discounted
return minus the value, λ = 0 the one-step TD error δ_t.

Episode ends: as in V-trace, ``discounts`` zeroes both the bootstrap and the recursion (pass
γ·(1 − done)); see :func:`impactrl.ops.returns.bootstrap_truncations` for folding V(x_final) of
a truncated episode into the reward.

Gradients
---------
``advantages`` and ``returns`` are targets: computed under :func:`torch.no_grad` from detached
inputs, without gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from impactrl.ops.checks import (
    check_has_time_steps,
    check_per_step,
    check_shape_of,
    check_shape_of_step,
    check_time_major,
    debug_check_floats,
    debug_check_like_values,
)

__all__ = ["GAEReturns", "generalized_advantage_estimation"]


class GAEReturns(NamedTuple):
    """Outputs of :func:`generalized_advantage_estimation`, ``[T, B, ...]``, gradient-free."""

    advantages: Tensor
    """GAE(γ, λ) advantages Â_t."""
    returns: Tensor
    """Value targets R_t = Â_t + V(x_t)."""


def _validate_gae_inputs(
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    discounts: Tensor,
    lambda_: float,
) -> None:
    named = [
        ("rewards", rewards),
        ("values", values),
        ("bootstrap_value", bootstrap_value),
        ("discounts", discounts),
    ]
    debug_check_floats(named)
    check_time_major("values", values)
    check_has_time_steps("values", values)
    check_shape_of("rewards", rewards, "values", values)
    check_shape_of_step("bootstrap_value", bootstrap_value, "values", values)
    check_per_step("discounts", discounts, "values", values)
    debug_check_like_values(named, values, lambda_)


def generalized_advantage_estimation(
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    discounts: Tensor,
    lambda_: float,
) -> GAEReturns:
    r"""GAE(γ, λ) advantages and value targets (Schulman et al. 2016, eq. (16)).

    Args:
        rewards: ``[T, B, ...]`` r_t.
        values: ``[T, B, ...]`` V(x_t).
        bootstrap_value: ``[B, ...]`` V(x_T), the shape of ``values[0]``.
        discounts: ``[T, B, ...]`` γ_t, multiplies V(x_{t+1}) in δ_t and λ·Â_{t+1} in the
            recursion (0 where the episode ended at step t).
        lambda_: λ in [0, 1].

    Returns:
        :class:`GAEReturns` ``(advantages, returns)``, both of the shape, dtype and device of
        ``values``, without gradient.

    Raises:
        ValueError: if ranks, shapes, dtypes, devices or ``lambda_`` are inconsistent.
    """
    _validate_gae_inputs(rewards, values, bootstrap_value, discounts, lambda_)
    with torch.no_grad():
        rewards = rewards.detach()
        values = values.detach()
        bootstrap_value = bootstrap_value.detach()
        discounts = discounts.detach()

        values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = rewards + discounts * values_tp1 - values  # [T, B, ...]
        trace_coeffs = discounts * lambda_

        T = values.shape[0]
        advantages = torch.empty(deltas.shape, dtype=deltas.dtype, device=deltas.device)
        advantages[T - 1] = deltas[T - 1]
        for t in range(T - 2, -1, -1):
            torch.addcmul(deltas[t], trace_coeffs[t], advantages[t + 1], out=advantages[t])
        returns = advantages + values

    return GAEReturns(advantages=advantages.detach(), returns=returns.detach())
