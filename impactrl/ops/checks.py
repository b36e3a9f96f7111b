"""Input validation shared by the maths in :mod:`impactrl.ops`.

Small checks used by :mod:`~impactrl.ops.vtrace`, :mod:`~impactrl.ops.gae`,
:mod:`~impactrl.ops.returns` and :mod:`~impactrl.ops.policy_losses`. Each raises
:class:`ValueError` with a message that names the argument and what was received (its type,
dtype, shape or device, and the reference it was compared with). The caller decides the order
of the checks, so which message a call with several problems gets is up to the caller.

Time-major conventions (``[T, B, ...]``, ``bootstrap_value`` the shape of ``values[0]``) are
those of :mod:`impactrl.ops.vtrace`.

The ops always check shapes (cheap: no device sync, and a wrong shape would broadcast into a
wrong answer in silence). Their other checks (tensor types, dtypes, devices and hyperparameter
values, which config validation already guarantees at the boundary) run only with debug checks
on, as rlax runs chex's: ``IMPACTRL_DEBUG_CHECKS=1`` in the environment, or
:func:`debug_checks` in code.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Callable, Iterator, Optional

import torch
from torch import Tensor

__all__ = [
    "DEBUG_CHECKS",
    "debug_checks",
    "shape_tuple",
    "check_float_tensor",
    "check_tensor_kind",
    "check_shape_of",
    "check_same_dtype",
    "check_same_device",
    "check_same_float",
    "check_time_major",
    "check_has_time_steps",
    "check_shape_of_step",
    "per_step_mismatch",
    "check_per_step",
    "debug_check_floats",
    "debug_check_like_values",
    "check_python_float",
    "check_unit_interval",
    "check_threshold",
    "check_positive_float",
]


DEBUG_CHECKS = os.environ.get("IMPACTRL_DEBUG_CHECKS", "0").strip() not in ("", "0")
"""Whether the ops also run their debug checks (read through the module: ``checks.DEBUG_CHECKS``)."""


@contextlib.contextmanager
def debug_checks(enabled: bool = True) -> Iterator[None]:
    """Debug checks on (or off) inside the ``with`` block, as they were after it."""
    global DEBUG_CHECKS
    previous, DEBUG_CHECKS = DEBUG_CHECKS, enabled
    try:
        yield
    finally:
        DEBUG_CHECKS = previous


def shape_tuple(x: Tensor) -> tuple[int, ...]:
    """``x.shape`` as a plain tuple (so messages read ``(5, 2)``, not ``torch.Size([5, 2])``)."""
    return tuple(x.shape)


# --------------------------------------------------------------------------------------------
# Type and dtype
# --------------------------------------------------------------------------------------------


def check_float_tensor(name: str, x: object) -> None:
    """Require ``x`` to be a floating-point :class:`torch.Tensor`.

    Raises:
        ValueError: ``"{name} must be a torch.Tensor, got {type}"`` for a non-tensor, or
            ``"{name} must be a floating-point tensor, got dtype {dtype}"``.
    """
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


_TENSOR_KINDS: dict[str, tuple[str, Callable[[Tensor], bool]]] = {
    "floating-point": ("a floating-point", lambda x: x.is_floating_point()),
    "integer": ("an integer", lambda x: not (x.is_floating_point() or x.is_complex())),
    "bool": ("a bool", lambda x: x.dtype == torch.bool),
}


def check_tensor_kind(name: str, x: object, kind: str, optional: bool = False) -> None:
    """Require ``x`` to be a tensor of ``kind`` (``"floating-point"``, ``"integer"``, ``"bool"``).

    Unlike :func:`check_float_tensor` this reports in one message, e.g.
    ``"rewards must be a floating-point torch.Tensor, got torch.int64"``, where the received
    part is the dtype of a tensor or the type name of anything else. ``"integer"`` accepts any
    non-floating, non-complex dtype, ``torch.bool`` included.

    With ``optional=True`` ``None`` passes and the message reads ``"... torch.Tensor or None"``.
    """
    if optional and x is None:
        return
    expected, accepts = _TENSOR_KINDS[kind]
    if not isinstance(x, Tensor) or not accepts(x):
        or_none = " or None" if optional else ""
        raise ValueError(
            f"{name} must be {expected} torch.Tensor{or_none}, got "
            f"{getattr(x, 'dtype', type(x).__name__)}"
        )


# --------------------------------------------------------------------------------------------
# Agreement with a reference tensor
# --------------------------------------------------------------------------------------------


def check_shape_of(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Require ``x.shape == ref.shape``.

    Raises:
        ValueError: ``"{name} must have the shape of {ref_name} {ref shape}, got {x shape}"``.
    """
    if shape_tuple(x) != shape_tuple(ref):
        raise ValueError(
            f"{name} must have the shape of {ref_name} {shape_tuple(ref)}, got {shape_tuple(x)}"
        )


def check_same_dtype(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Require ``x.dtype == ref.dtype``.

    Raises:
        ValueError: ``"{name} must have the dtype of {ref_name} ({ref dtype}), got {x dtype}"``.
    """
    if x.dtype != ref.dtype:
        raise ValueError(f"{name} must have the dtype of {ref_name} ({ref.dtype}), got {x.dtype}")


def check_same_device(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Require ``x.device == ref.device``.

    Raises:
        ValueError: ``"{name} must be on the device of {ref_name} ({ref device}), got
            {x device}"``.
    """
    if x.device != ref.device:
        raise ValueError(
            f"{name} must be on the device of {ref_name} ({ref.device}), got {x.device}"
        )


def check_same_float(reference_name: str, reference: Tensor, *named: tuple[str, object]) -> None:
    """Require ``reference`` and every ``(name, x)`` in ``named`` to be floating-point tensors,
    and each ``x`` to have the shape, dtype and device of ``reference``.

    All tensors are type-checked first (:func:`check_float_tensor`, ``reference`` first), then
    each ``x`` in turn is checked for shape (:func:`check_shape_of`), dtype and device.
    """
    for name, x in ((reference_name, reference), *named):
        check_float_tensor(name, x)
    for name, x in named:
        assert isinstance(x, Tensor)
        check_shape_of(name, x, reference_name, reference)
        check_same_dtype(name, x, reference_name, reference)
        check_same_device(name, x, reference_name, reference)


# --------------------------------------------------------------------------------------------
# Time-major shapes
# --------------------------------------------------------------------------------------------


def check_time_major(name: str, x: Tensor) -> None:
    """Require ``x`` to have rank >= 2 (``[T, B, ...]``).

    Raises:
        ValueError: ``"{name} must be time-major [T, B, ...] with rank >= 2, got shape ..."``.
    """
    if x.dim() < 2:
        raise ValueError(
            f"{name} must be time-major [T, B, ...] with rank >= 2, got shape {shape_tuple(x)}"
        )


def check_has_time_steps(name: str, x: Tensor) -> None:
    """Require ``T = x.shape[0] >= 1`` (``x`` of rank >= 1).

    Raises:
        ValueError: ``"{name} must have at least one time step, got shape ..."``.
    """
    if x.shape[0] < 1:
        raise ValueError(f"{name} must have at least one time step, got shape {shape_tuple(x)}")


def check_shape_of_step(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Require ``x`` to have the shape of one time step of ``ref``, i.e. ``ref.shape[1:]``.

    Used for ``bootstrap_value`` against ``[T, B, ...]`` per-step tensors.

    Raises:
        ValueError: ``"{name} must have the shape of {ref_name}[0] = {ref.shape[1:]}, got
            {x shape}"``.
    """
    if shape_tuple(x) != shape_tuple(ref)[1:]:
        raise ValueError(
            f"{name} must have the shape of {ref_name}[0] = {shape_tuple(ref)[1:]}, got "
            f"{shape_tuple(x)}"
        )


def per_step_mismatch(name: str, x: Tensor, ref_name: str, ref: Tensor) -> Optional[str]:
    """Why ``x`` is not a per-step tensor for ``ref`` (``[T, B, ...]``, rank >= 1), or ``None``.

    ``x`` fits when it has the rank of ``ref``, the same ``T = ref.shape[0]`` and every
    trailing dim equal to that of ``ref`` or 1 (so it broadcasts against ``ref``). The reason
    names ``x`` and both shapes; :func:`check_per_step` raises it.
    """
    rank = ref.dim()
    if x.dim() != rank:
        return (
            f"{name} rank must equal {ref_name} rank {rank}, got {name} shape {shape_tuple(x)} "
            f"and {ref_name} shape {shape_tuple(ref)}"
        )
    T = ref.shape[0]
    if x.shape[0] != T:
        return (
            f"{name} must have T = {T} time steps like {ref_name}, got {name} shape "
            f"{shape_tuple(x)} and {ref_name} shape {shape_tuple(ref)}"
        )
    for d in range(1, rank):
        if x.shape[d] not in (1, ref.shape[d]):
            return (
                f"{name} shape {shape_tuple(x)} does not broadcast to {ref_name} shape "
                f"{shape_tuple(ref)} (dim {d} must be 1 or {ref.shape[d]})"
            )
    return None


def check_per_step(name: str, x: Tensor, ref_name: str, ref: Tensor) -> None:
    """Require ``x`` to be a per-step tensor for ``ref`` (see :func:`per_step_mismatch`).

    Raises:
        ValueError: with the reason from :func:`per_step_mismatch`.
    """
    reason = per_step_mismatch(name, x, ref_name, ref)
    if reason is not None:
        raise ValueError(reason)


def debug_check_floats(named: list[tuple[str, object]]) -> None:
    """With debug checks: each ``(name, x)`` of ``named`` is a floating-point tensor."""
    if DEBUG_CHECKS:
        for name, x in named:
            check_float_tensor(name, x)


def debug_check_like_values(named: list[tuple[str, Tensor]], values: Tensor, lambda_: float) -> None:
    """With debug checks, for the time-major ops (V-trace, GAE): each of ``named`` has the dtype
    and device of ``values``, and λ is in [0, 1]."""
    if DEBUG_CHECKS:
        for name, x in named:
            check_same_dtype(name, x, "values", values)
            check_same_device(name, x, "values", values)
        check_unit_interval("lambda_", lambda_)


# --------------------------------------------------------------------------------------------
# Python scalars (hyperparameters)
# --------------------------------------------------------------------------------------------


def check_python_float(name: str, value: object, expected: str = "a Python float") -> None:
    """Require ``value`` to be a Python ``int`` or ``float`` (``bool`` and tensors rejected).

    Raises:
        ValueError: ``"{name} must be {expected}, got {type}"``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be {expected}, got {type(value).__name__}")


def check_unit_interval(name: str, value: object) -> None:
    """Require ``value`` to be a Python float in ``[0, 1]`` (NaN rejected).

    Raises:
        ValueError: from :func:`check_python_float`, or ``"{name} must be in [0, 1], got ..."``.
    """
    check_python_float(name, value)
    if not 0.0 <= value <= 1.0:  # type: ignore[operator]
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_threshold(name: str, value: Optional[float]) -> None:
    """Require a clipping threshold: ``None`` (no clipping) or a Python float >= 0 (not NaN).

    Raises:
        ValueError: ``"{name} must be a Python float or None, got {type}"`` or
            ``"{name} must be >= 0 or None (no clipping), got ..."``.
    """
    if value is None:
        return
    check_python_float(name, value, "a Python float or None")
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0 or None (no clipping), got {value}")


def check_positive_float(name: str, value: object, allow_zero: bool = False) -> float:
    """Require a finite Python float > 0 (>= 0 with ``allow_zero``) and return it as ``float``.

    Raises:
        ValueError: from :func:`check_python_float`, or ``"{name} must be finite and > 0, got
            ..."`` (``>=`` with ``allow_zero``).
    """
    check_python_float(name, value)
    ok = value >= 0 if allow_zero else value > 0  # type: ignore[operator]
    if not ok or not math.isfinite(value):  # type: ignore[arg-type]
        raise ValueError(f"{name} must be finite and {'>=' if allow_zero else '>'} 0, got {value}")
    return float(value)  # type: ignore[arg-type]
