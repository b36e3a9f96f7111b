r"""Discounts, truncation bootstrapping and plain discounted returns.

All tensors are time-major ``[T, B]``: index ``t`` refers to the transition
``(x_t, a_t, r_t, x_{t+1})``; ``bootstrap_value`` is V(x_T), the value of the observation after
the unroll. Same convention as :mod:`impactrl.ops.vtrace` (Espeholt et al. 2018,
arXiv 1802.01561, eq. (1)).

Discounted return (used as a reference and as PPO's λ = 1 return):

    G_T = bootstrap_value,
    G_t = r_t + γ_t · G_{t+1}        for t = T−1, …, 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from impactrl.ops import checks
from impactrl.ops.checks import (
    check_same_device,
    check_shape_of,
    check_shape_of_step,
    check_tensor_kind,
    check_unit_interval,
    per_step_mismatch,
    shape_tuple,
)

__all__ = ["bootstrap_truncations", "discounted_returns", "explained_variance"]


def bootstrap_truncations(
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    truncation_values: Tensor,
    discount: float,
) -> tuple[Tensor, Tensor]:
    r"""Per-step ``(rewards, discounts)`` with time-limit truncation handled.

    Gymnasium distinguishes *termination* (the MDP ended: the value after it is 0) from
    *truncation* (a time limit cut the episode: the value after it is V(x_final), not 0). With
    auto-reset, the observation stored after a truncated step is already the reset observation
    of the *next* episode, so bootstrapping from it would be wrong. The actor therefore computes
    ``truncation_values[t] = V(x_final)`` for the real final observation of the truncated
    episode, and this function folds it into the reward and cuts the bootstrap and the trace:

    ====================  ==========================  =====================
    step t                rewards_t                   discounts_t
    ====================  ==========================  =====================
    no episode end        r_t                         γ
    terminated            r_t                         0
    truncated only        r_t + γ · V(x_final)        0
    ====================  ==========================  =====================

    (a step both terminated and truncated counts as terminated). That is,
    ``discounts = γ · (1 − (terminated | truncated))``, which zeroes both the bootstrap and the
    trace in :func:`impactrl.ops.vtrace.vtrace_from_importance_weights` and
    :func:`impactrl.ops.gae.generalized_advantage_estimation`. V-trace then computes at a
    truncated step exactly δ_t = ρ_t (r_t + γ V(x_final) − V(x_t)) and
    A_t = ρ^pg_t (r_t + γ V(x_final) − V(x_t)), with no trace into the next episode. Note that
    V(x_final) comes from the actor's (behaviour) parameters, not the learner's current ones.

    Args:
        rewards: float ``[T, B]`` r_t.
        terminated: bool ``[T, B]``, True where the transition out of x_t terminated.
        truncated: bool ``[T, B]``, True where a time limit cut the episode after step t.
        truncation_values: float ``[T, B]``, V(x_final) where truncated; ignored (may hold
            anything, even NaN) elsewhere.
        discount: γ, a Python float in [0, 1].

    Returns:
        ``(rewards, discounts)``, each ``[T, B]`` with the dtype and device of ``rewards``.
    """
    debug = checks.DEBUG_CHECKS
    if debug:
        check_tensor_kind("rewards", rewards, "floating-point")
        check_tensor_kind("truncation_values", truncation_values, "floating-point")
        for name, x in (("terminated", terminated), ("truncated", truncated)):
            check_tensor_kind(name, x, "bool")
    if rewards.dim() < 2:
        raise ValueError(
            f"rewards must be time-major [T, B] with rank >= 2, got shape {shape_tuple(rewards)}"
        )
    for name, x in (
        ("terminated", terminated),
        ("truncated", truncated),
        ("truncation_values", truncation_values),
    ):
        check_shape_of(name, x, "rewards", rewards)
        if debug:
            check_same_device(name, x, "rewards", rewards)
    if debug:
        check_unit_interval("discount", discount)

    done = terminated | truncated
    truncated_only = truncated & ~terminated
    bootstrapped = rewards + discount * truncation_values.to(rewards.dtype)
    new_rewards = torch.where(truncated_only, bootstrapped, rewards)
    not_done = (~done).to(rewards.dtype)
    return new_rewards, discount * not_done


def discounted_returns(rewards: Tensor, discounts: Tensor, bootstrap_value: Tensor) -> Tensor:
    r"""n-step discounted return G_t = r_t + γ_t G_{t+1}, G_T = ``bootstrap_value``.

    Args:
        rewards: float ``[T, B, ...]`` r_t.
        discounts: float ``[T, B, ...]`` γ_t (0 where the episode ended at step t); same rank
            as ``rewards``, each trailing dim equal or 1.
        bootstrap_value: float ``[B, ...]`` V(x_T), the shape of ``rewards[0]``.

    Returns:
        ``[T, B, ...]`` returns G_t with the dtype and device of ``rewards``, without gradient
        (they are targets).
    """
    for name, x in (
        ("rewards", rewards),
        ("discounts", discounts),
        ("bootstrap_value", bootstrap_value),
    ):
        if not checks.DEBUG_CHECKS:
            break
        check_tensor_kind(name, x, "floating-point")
        if x.dtype != rewards.dtype or x.device != rewards.device:
            raise ValueError(
                f"{name} must have the dtype and device of rewards ({rewards.dtype}, "
                f"{rewards.device}), got ({x.dtype}, {x.device})"
            )
    if rewards.dim() < 2 or rewards.shape[0] < 1:
        raise ValueError(
            "rewards must be time-major [T, B, ...] with T >= 1, got shape "
            f"{shape_tuple(rewards)}"
        )
    if per_step_mismatch("discounts", discounts, "rewards", rewards) is not None:
        raise ValueError(
            f"discounts shape {shape_tuple(discounts)} does not match rewards shape "
            f"{shape_tuple(rewards)} (same rank and T; trailing dims equal or 1)"
        )
    check_shape_of_step("bootstrap_value", bootstrap_value, "rewards", rewards)
    with torch.no_grad():
        rewards = rewards.detach()
        discounts = discounts.detach()
        T = rewards.shape[0]
        returns = torch.empty(rewards.shape, dtype=rewards.dtype, device=rewards.device)
        nxt = bootstrap_value.detach()
        for t in range(T - 1, -1, -1):
            torch.addcmul(rewards[t], discounts[t], nxt, out=returns[t])
            nxt = returns[t]
    return returns


def explained_variance(values: Tensor, targets: Tensor) -> Tensor:
    r"""How much of the targets' variance the values explain: 1 − Var[v − V] / Var[v] (population
    variances over all entries). 1 is perfect, 0 no better than a constant, negative worse;
    NaN when the targets are constant."""
    values, targets = values.detach().float(), targets.detach().float()
    return 1.0 - (targets - values).var(unbiased=False) / targets.var(unbiased=False)
