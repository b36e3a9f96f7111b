r"""V-trace off-policy value targets and policy-gradient advantages.

Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", arXiv 1802.01561, eq. (1) (the n-step V-trace target) and §4.2
(the policy-gradient advantage).

Shapes (time-major)
-------------------
All per-step inputs are ``[T, B]`` (optionally with extra trailing dims, ``[T, B, ...]``):

=====================  ==========  ==========================================================
name                   shape       meaning
=====================  ==========  ==========================================================
``log_rhos``           [T, B]      log π(a_t|x_t) − log μ(a_t|x_t); π = target (learner)
                                   policy, μ = behaviour (actor) policy that chose a_t
``discounts``          [T, B]      γ_t; multiplies the bootstrap V(x_{t+1}) and the trace (0 at
                                   an episode end)
``rewards``            [T, B]      r_t, the reward that followed a_t
``values``             [T, B]      V(x_t), learner's current value estimates
``bootstrap_value``    [B]         V(x_T), the value of the observation after the unroll
=====================  ==========  ==========================================================

Time-index convention: index ``t`` of every tensor refers to the transition out of x_t, i.e.
``(x_t, a_t, r_t, γ_t, x_{t+1})``, and ``bootstrap_value`` plays the role of ``values[T]``.

Extra trailing dims broadcast: ``log_rhos`` and ``discounts`` must have the same rank as
``values`` with each dim equal to that of ``values`` or 1 (e.g. ``[T, B, 1]`` against ``values``
``[T, B, 42]``); ``rewards`` has exactly the shape of ``values``; ``bootstrap_value`` has exactly
the shape of ``values[0]``. Outputs have the shape of ``values``.

Maths
-----
With truncated importance weights (a threshold of ``None`` means "no clipping")

    ρ_t    = min(ρ̄,    π(a_t|x_t) / μ(a_t|x_t))
    c_t    = λ · min(c̄, π(a_t|x_t) / μ(a_t|x_t))
    ρ^pg_t = min(ρ̄_pg, π(a_t|x_t) / μ(a_t|x_t))

and the temporal-difference error

    δ_t = ρ_t · (r_t + γ_t · V(x_{t+1}) − V(x_t)),       V(x_T) := bootstrap_value,

eq. (1) reads (empty products are 1)

    v_s = V(x_s) + Σ_{t=s}^{T−1} ( Π_{i=s}^{t−1} γ_i c_i ) δ_t,

which is computed by the equivalent backward recursion

    a_T = 0,
    a_t = δ_t + γ_t · c_t · a_{t+1}        for t = T−1, …, 0,
    v_t = V(x_t) + a_t.

The policy-gradient advantage (§4.2) uses the V-trace target of the next step:

    A_t = ρ^pg_t · (r_t + γ_t · v_{t+1} − V(x_t)),        v_T := bootstrap_value.

With λ < 1 the same formula is used with the λ-weighted target v_{t+1} (rlax instead mixes
λ v_{t+1} + (1 − λ) V(x_{t+1}) there; with λ = 1 both agree).

Episode ends
------------
``discounts`` (γ_t) multiplies the bootstrap V(x_{t+1}) in δ_t, v_{t+1} in A_t and the trace
a_{t+1} in the recursion, as in the reference IMPALA code (γ·(1 − done)): an episode end both
zeroes the bootstrap and cuts the trace, so an unroll that crosses an auto-reset does not leak
the next episode's returns into this one. A time-limit truncation is handled before V-trace by
:func:`impactrl.ops.returns.bootstrap_truncations`, which folds the value of the real final
observation of the truncated episode into the reward.

Gradients
---------
``vs`` and ``pg_advantages`` are targets: they are computed under :func:`torch.no_grad` from
detached inputs and carry no gradient.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from impactrl.ops import checks
from impactrl.ops.checks import (
    check_has_time_steps,
    check_per_step,
    check_shape_of,
    check_shape_of_step,
    check_threshold,
    check_time_major,
    debug_check_floats,
    debug_check_like_values,
    shape_tuple,
)

__all__ = ["VTraceReturns", "vtrace_from_importance_weights"]


class VTraceReturns(NamedTuple):
    """Outputs of :func:`vtrace_from_importance_weights`, both ``[T, B, ...]`` and gradient-free."""

    vs: Tensor
    """V-trace value targets v_t, the targets for the baseline V(x_t)."""
    pg_advantages: Tensor
    """Policy-gradient advantages ρ^pg_t (r_t + γ_t v_{t+1} − V(x_t))."""


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _validate_vtrace_inputs(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: Optional[float],
    clip_pg_rho_threshold: Optional[float],
    clip_c_threshold: Optional[float],
    lambda_: float,
) -> None:
    named = [
        ("log_rhos", log_rhos),
        ("discounts", discounts),
        ("rewards", rewards),
        ("values", values),
        ("bootstrap_value", bootstrap_value),
    ]
    debug_check_floats(named)
    check_time_major("values", values)
    rank = values.dim()
    if log_rhos.dim() != discounts.dim():
        raise ValueError(
            f"log_rhos rank must equal discounts rank, got log_rhos shape {shape_tuple(log_rhos)} "
            f"and discounts shape {shape_tuple(discounts)}"
        )
    check_shape_of("rewards", rewards, "values", values)
    if bootstrap_value.dim() != rank - 1:
        raise ValueError(
            f"bootstrap_value rank must be values rank - 1 = {rank - 1}, got bootstrap_value "
            f"shape {shape_tuple(bootstrap_value)} (rank {bootstrap_value.dim()}) and values "
            f"shape {shape_tuple(values)} (rank {rank})"
        )
    check_shape_of_step("bootstrap_value", bootstrap_value, "values", values)
    check_has_time_steps("values", values)
    for name, x in (("log_rhos", log_rhos), ("discounts", discounts)):
        check_per_step(name, x, "values", values)
    debug_check_like_values(named, values, lambda_)
    if checks.DEBUG_CHECKS:
        check_threshold("clip_rho_threshold", clip_rho_threshold)
        check_threshold("clip_pg_rho_threshold", clip_pg_rho_threshold)
        check_threshold("clip_c_threshold", clip_c_threshold)


# --------------------------------------------------------------------------------------------
# V-trace
# --------------------------------------------------------------------------------------------


def vtrace_from_importance_weights(
    log_rhos: Tensor,
    discounts: Tensor,
    rewards: Tensor,
    values: Tensor,
    bootstrap_value: Tensor,
    clip_rho_threshold: Optional[float] = 1.0,
    clip_pg_rho_threshold: Optional[float] = 1.0,
    clip_c_threshold: Optional[float] = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    r"""V-trace targets ``vs`` and advantages ``pg_advantages`` from log importance weights.

    Args:
        log_rhos: ``[T, B, ...]`` log π(a_t|x_t) − log μ(a_t|x_t).
        discounts: ``[T, B, ...]`` γ_t, multiplies the bootstrap V(x_{t+1}) in δ_t, v_{t+1}
            in A_t and the trace in a_t = δ_t + γ_t c_t a_{t+1} (0 where the episode ended at
            step t).
        rewards: ``[T, B, ...]`` r_t.
        values: ``[T, B, ...]`` V(x_t).
        bootstrap_value: ``[B, ...]`` V(x_T), the shape of ``values[0]``.
        clip_rho_threshold: ρ̄ for ρ_t in δ_t; ``None`` = no clipping.
        clip_pg_rho_threshold: ρ̄_pg for the advantage weight; ``None`` = no clipping.
        clip_c_threshold: c̄ for the trace coefficients c_t; ``None`` = no clipping.
        lambda_: λ in c_t = λ · min(c̄, π/μ), in [0, 1].

    Returns:
        :class:`VTraceReturns` ``(vs, pg_advantages)``, both of the shape of ``values``, with
        its dtype and device, and without gradient.

    Raises:
        ValueError: if ranks, shapes, dtypes, devices or hyperparameters are inconsistent.
    """
    _validate_vtrace_inputs(
        log_rhos,
        discounts,
        rewards,
        values,
        bootstrap_value,
        clip_rho_threshold,
        clip_pg_rho_threshold,
        clip_c_threshold,
        lambda_,
    )
    with torch.no_grad():
        log_rhos = log_rhos.detach()
        discounts = discounts.detach()
        rewards = rewards.detach()
        values = values.detach()
        bootstrap_value = bootstrap_value.detach()

        rhos = torch.exp(log_rhos)
        clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
        cs = rhos if clip_c_threshold is None else rhos.clamp(max=clip_c_threshold)
        if lambda_ != 1.0:
            cs = cs * lambda_
        clipped_pg_rhos = (
            rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
        )

        # V(x_{t+1}) for t = 0..T-1, with V(x_T) = bootstrap_value.
        values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)  # [T, B, ...]
        trace_coeffs = discounts * cs  # [T, B, ...] or broadcastable to it

        # Backward recursion a_t = δ_t + γ_t c_t a_{t+1}: one fused op per step on views taken
        # once (indexing inside the loop would cost more dispatches than the arithmetic).
        step_deltas, step_coeffs = deltas.unbind(0), trace_coeffs.unbind(0)
        a = step_deltas[-1]
        corrections = [a]
        for t in range(len(step_deltas) - 2, -1, -1):
            a = torch.addcmul(step_deltas[t], step_coeffs[t], a)
            corrections.append(a)
        vs = torch.stack(corrections[::-1]) + values

        # A_t = ρ^pg_t (r_t + γ_t v_{t+1} − V(x_t)), with v_T = bootstrap_value.
        vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_advantages = clipped_pg_rhos * (rewards + discounts * vs_tp1 - values)

    return VTraceReturns(vs=vs.detach(), pg_advantages=pg_advantages.detach())

