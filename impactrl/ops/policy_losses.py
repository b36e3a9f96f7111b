r"""Clipped-surrogate policy losses (PPO, IMPACT), value loss and the adaptive KL coefficient.

- :func:`ppo_clipped_surrogate`: Schulman et al. 2017, "Proximal Policy Optimization
  Algorithms", arXiv 1707.06347, eq. (7) (L^CLIP).
- :func:`impact_surrogate`: Luo et al. 2020, "IMPACT: Importance Weighted Asynchronous
  Architectures with Clipped Target Networks", arXiv 1912.00167, §3.1 (the clipped-target
  surrogate with maximal target-worker clipping), as implemented by the author and RLlib APPO
  (docs/algorithms.md#impact-loss).
- :func:`value_loss`: 0.5·mean squared error, optionally with CleanRL's value clipping
  (docs/algorithms.md#impact-loss, docs/algorithms.md#ppo-loss).
- :func:`adaptive_kl_coefficient`: the adaptive KL-penalty coefficient of Schulman et al. 2017,
  §4 (docs/algorithms.md#impact-loss).

Shapes: every per-step tensor of one call has the same shape (typically time-major ``[T, B]``,
but any shape works, the functions are elementwise then reduce over every element). Losses are
*minimised*: they are the negated objectives.

Gradients: losses are differentiable with respect to ``log_prob`` (and ``values``) only;
``old_log_prob``, ``target_log_prob``, ``behaviour_log_prob``, ``advantages``, ``targets``,
``old_values`` are treated as constants (detached). Statistics are detached 0-d tensors (call
``.item()`` when logging; they are not synchronised here to avoid a device sync).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor

from impactrl.ops import checks
from impactrl.ops.checks import (
    check_positive_float,
    check_python_float,
    check_same_float,
    check_shape_of,
    shape_tuple,
)

__all__ = [
    "ppo_clipped_surrogate",
    "impact_surrogate",
    "value_loss",
    "adaptive_kl_coefficient",
]


# --------------------------------------------------------------------------------------------
# Shared
# --------------------------------------------------------------------------------------------


def _check_like(reference_name: str, reference: Tensor, *named: tuple[str, Tensor]) -> None:
    """Each of ``named`` has the shape of ``reference``; with debug checks, also that all are
    floating-point tensors of its dtype and device (``check_same_float``)."""
    if checks.DEBUG_CHECKS:
        check_same_float(reference_name, reference, *named)
        return
    for name, x in named:
        check_shape_of(name, x, reference_name, reference)


def _positive(name: str, value: float, allow_zero: bool = False) -> float:
    """``value`` as a float, checked to be finite and > 0 (>= 0) with debug checks."""
    return check_positive_float(name, value, allow_zero) if checks.DEBUG_CHECKS else float(value)


def _clipped_surrogate(ratio: Tensor, advantages: Tensor, clip_param: float) -> tuple[Tensor, Tensor]:
    """−mean(min(r·Â, clip(r, 1−ε, 1+ε)·Â)) and the fraction of steps with |r − 1| > ε."""
    surrogate = torch.min(
        ratio * advantages, ratio.clamp(1.0 - clip_param, 1.0 + clip_param) * advantages
    )
    loss = -surrogate.mean()
    with torch.no_grad():
        clip_fraction = ((ratio.detach() - 1.0).abs() > clip_param).to(ratio.dtype).mean()
    return loss, clip_fraction


# --------------------------------------------------------------------------------------------
# PPO
# --------------------------------------------------------------------------------------------


def ppo_clipped_surrogate(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    clip_param: float,
) -> tuple[Tensor, Tensor]:
    r"""PPO's clipped surrogate loss (Schulman et al. 2017, eq. (7)).

        r_t  = exp(log π_θ(a_t|x_t) − log π_old(a_t|x_t)),
        loss = −mean_t min( r_t · Â_t, clip(r_t, 1 − ε, 1 + ε) · Â_t ).

    Advantage normalisation, if wanted, is the caller's job (it is not part of eq. (7)).

    Args:
        log_prob: log π_θ(a_t|x_t), differentiable.
        old_log_prob: log π_old(a_t|x_t), same shape; treated as a constant.
        advantages: Â_t, same shape; treated as a constant.
        clip_param: ε > 0.

    Returns:
        ``(loss, clip_fraction)``: the scalar loss (to minimise) and the detached fraction of
        steps with |r_t − 1| > ε.
    """
    _check_like("log_prob", log_prob, ("old_log_prob", old_log_prob), ("advantages", advantages))
    clip_param = _positive("clip_param", clip_param)
    ratio = torch.exp(log_prob - old_log_prob.detach())
    return _clipped_surrogate(ratio, advantages.detach(), clip_param)


# --------------------------------------------------------------------------------------------
# IMPACT
# --------------------------------------------------------------------------------------------


def impact_surrogate(
    log_prob: Tensor,
    target_log_prob: Tensor,
    behaviour_log_prob: Tensor,
    advantages: Tensor,
    clip_param: float,
    target_worker_clip: Optional[float],
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""IMPACT's clipped-target surrogate (Luo et al. 2020, §3.1; docs/algorithms.md#impact-loss).

    With μ the worker's behaviour policy, π_tgt the target network and ρ = ``target_worker_clip``:

        w_t    = min( μ(a_t|x_t) / π_tgt(a_t|x_t), ρ )              (a constant),
        r_t(θ) = w_t · π_θ(a_t|x_t) / μ(a_t|x_t),
        loss   = −mean_t min( r_t · Â_t, clip(r_t, 1 − ε, 1 + ε) · Â_t ).

    Where μ/π_tgt ≤ ρ this is r_t = π_θ/π_tgt, a PPO ratio against the stable target network;
    otherwise r_t = ρ · π_θ/μ. Computed in log space:
    ``r = exp(log_prob − behaviour_log_prob + min(behaviour_log_prob − target_log_prob, log ρ))``.
    With ``target_worker_clip=None`` the weight is the unclipped μ/π_tgt, i.e. r = π_θ/π_tgt.
    No gradient flows through ``target_log_prob`` or ``behaviour_log_prob`` (or ``advantages``).
    RLlib clips the weight to [0, ρ]; the lower bound is inactive since w > 0.

    Args:
        log_prob: log π_θ(a_t|x_t), differentiable.
        target_log_prob: log π_tgt(a_t|x_t), same shape; constant.
        behaviour_log_prob: log μ(a_t|x_t), same shape; constant.
        advantages: Â_t (IMPACT: from V-trace with log π_tgt − log μ), same shape; constant.
        clip_param: ε > 0 (RLlib default 0.4).
        target_worker_clip: ρ > 0 (the paper's value is 2.0), or ``None`` for no clipping.

    Returns:
        ``(loss, stats)``; ``stats`` holds detached 0-d tensors over all steps:
        ``"is_weight_mean"`` and ``"is_weight_var"`` (population variance) of w_t,
        ``"is_weight_clipped_fraction"`` (fraction with μ/π_tgt > ρ; 0 when ρ is ``None``) and
        ``"clip_fraction"`` (fraction with |r_t − 1| > ε).
    """
    _check_like(
        "log_prob",
        log_prob,
        ("target_log_prob", target_log_prob),
        ("behaviour_log_prob", behaviour_log_prob),
        ("advantages", advantages),
    )
    clip_param = _positive("clip_param", clip_param)
    if target_worker_clip is not None:
        target_worker_clip = _positive("target_worker_clip", target_worker_clip)

    with torch.no_grad():
        behaviour = behaviour_log_prob.detach()
        log_weight_unclipped = behaviour - target_log_prob.detach()  # log μ/π_tgt
        if target_worker_clip is None:
            log_weight = log_weight_unclipped
            weight_clipped = torch.zeros_like(log_weight)
        else:
            log_rho = math.log(target_worker_clip)
            log_weight = log_weight_unclipped.clamp(max=log_rho)
            weight_clipped = (log_weight_unclipped > log_rho).to(log_weight.dtype)
        weight = torch.exp(log_weight)

    ratio = torch.exp(log_prob - behaviour + log_weight)
    loss, clip_fraction = _clipped_surrogate(ratio, advantages.detach(), clip_param)

    with torch.no_grad():
        weight_mean = weight.mean()
        weight_var = ((weight - weight_mean) ** 2).mean()
        stats = {
            "is_weight_mean": weight_mean,
            "is_weight_var": weight_var,
            "is_weight_clipped_fraction": weight_clipped.mean(),
            "clip_fraction": clip_fraction,
        }
    return loss, stats


# --------------------------------------------------------------------------------------------
# Value loss
# --------------------------------------------------------------------------------------------


def value_loss(
    values: Tensor,
    targets: Tensor,
    old_values: Optional[Tensor] = None,
    clip_param: Optional[float] = None,
) -> Tensor:
    r"""0.5 · mean squared error of the value head, optionally clipped (CleanRL's PPO).

    Without clipping (``clip_param=None``; IMPACT/APPO, docs/algorithms.md#impact-loss):

        L_V = 0.5 · mean_t (V_θ(x_t) − R_t)².

    With clipping (PPO as in CleanRL, docs/algorithms.md#ppo-loss):

        V_clip = V_old + clamp(V_θ − V_old, −ε, ε),
        L_V    = 0.5 · mean_t max( (V_θ − R_t)², (V_clip − R_t)² ).

    Args:
        values: V_θ(x_t), differentiable.
        targets: R_t, same shape; constant.
        old_values: V_old(x_t) from the rollout, same shape; constant. Required when
            ``clip_param`` is given, ignored (may be passed) when it is ``None``.
        clip_param: ε > 0 for value clipping, or ``None`` for the plain squared error.

    Returns:
        The scalar loss.
    """
    _check_like("values", values, ("targets", targets))
    targets = targets.detach()
    unclipped = (values - targets) ** 2
    if clip_param is None:
        return 0.5 * unclipped.mean()
    clip_param = _positive("clip_param", clip_param)
    if old_values is None:
        raise ValueError("old_values must be given when clip_param is not None (value clipping)")
    _check_like("values", values, ("old_values", old_values))
    old_values = old_values.detach()
    clipped_values = old_values + (values - old_values).clamp(-clip_param, clip_param)
    clipped = (clipped_values - targets) ** 2
    return 0.5 * torch.max(unclipped, clipped).mean()


# --------------------------------------------------------------------------------------------
# Adaptive KL coefficient
# --------------------------------------------------------------------------------------------


def adaptive_kl_coefficient(
    coefficient: Union[float, Tensor], kl: Union[float, Tensor], kl_target: float
) -> Union[float, Tensor]:
    r"""One update of the adaptive KL-penalty coefficient β (Schulman et al. 2017, §4).

    As in RLlib (docs/algorithms.md#impact-loss):

        β ← 1.5 β   if KL > 2 · kl_target,
        β ← 0.5 β   if KL < 0.5 · kl_target,
        β ← β       otherwise.

    Args:
        coefficient: current β >= 0, a Python float or a one-element tensor.
        kl: measured mean KL(π_tgt || π_θ), a Python float or a one-element tensor. A NaN KL
            leaves β unchanged.
        kl_target: target KL > 0.

    Returns:
        The new β: a Python float when β and the KL are floats; otherwise a 0-d tensor on the
        device of the tensor given, computed there without reading it (no device sync).
    """
    kl_target = _positive("kl_target", kl_target)
    for name, value in (("coefficient", coefficient), ("kl", kl)):
        if isinstance(value, Tensor) and value.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {shape_tuple(value)}")
    if isinstance(coefficient, Tensor) or isinstance(kl, Tensor):
        if checks.DEBUG_CHECKS and not isinstance(coefficient, Tensor):
            check_positive_float("coefficient", coefficient, allow_zero=True)
        kl = torch.as_tensor(kl).detach().reshape(())
        coefficient = torch.as_tensor(coefficient, device=kl.device).reshape(())
        return torch.where(kl > 2.0 * kl_target, coefficient * 1.5,
                           torch.where(kl < 0.5 * kl_target, coefficient * 0.5, coefficient))
    coefficient = _positive("coefficient", coefficient, allow_zero=True)
    if checks.DEBUG_CHECKS:
        check_python_float("kl", kl, "a Python float or a one-element tensor")
    kl_value = float(kl)
    if kl_value > 2.0 * kl_target:
        return coefficient * 1.5
    if kl_value < 0.5 * kl_target:
        return coefficient * 0.5
    return coefficient
