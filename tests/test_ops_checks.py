"""Tests of the shared validation helpers in :mod:`impactrl.ops.checks`."""

import pytest
import torch

from impactrl.ops import checks
from impactrl.ops.checks import (
    check_per_step,
    check_positive_float,
    check_tensor_kind,
    check_threshold,
    check_unit_interval,
    per_step_mismatch,
)
from impactrl.ops.policy_losses import value_loss
from impactrl.ops.vtrace import vtrace_from_importance_weights


def test_per_step_mismatch_accepts_broadcastable_and_names_the_problem():
    values = torch.zeros(5, 2, 3)
    for shape in [(5, 2, 3), (5, 1, 3), (5, 2, 1), (5, 1, 1)]:
        assert per_step_mismatch("d", torch.zeros(shape), "values", values) is None
    assert "d rank must equal values rank 3" in per_step_mismatch(
        "d", torch.zeros(5, 2), "values", values
    )
    assert "d must have T = 5 time steps like values" in per_step_mismatch(
        "d", torch.zeros(4, 2, 3), "values", values
    )
    with pytest.raises(ValueError, match=r"d shape \(5, 3, 3\) does not broadcast .*dim 1"):
        check_per_step("d", torch.zeros(5, 3, 3), "values", values)


def test_check_tensor_kind_wording():
    check_tensor_kind("mask", None, "bool", optional=True)
    check_tensor_kind("a", torch.zeros(2, dtype=torch.bool), "integer")  # bool is not excluded
    with pytest.raises(
        ValueError, match=r"^mask must be a bool torch.Tensor or None, got torch.float32$"
    ):
        check_tensor_kind("mask", torch.zeros(2), "bool", optional=True)
    with pytest.raises(ValueError, match=r"^a must be an integer torch.Tensor, got torch.float64$"):
        check_tensor_kind("a", torch.zeros(2, dtype=torch.float64), "integer")
    with pytest.raises(ValueError, match=r"^r must be a floating-point torch.Tensor, got list$"):
        check_tensor_kind("r", [1.0], "floating-point")


def test_scalar_checks():
    assert check_positive_float("c", 2) == 2.0 and isinstance(check_positive_float("c", 2), float)
    assert check_positive_float("c", 0.0, allow_zero=True) == 0.0
    for bad in [0.0, -1.0, float("inf"), float("nan")]:
        with pytest.raises(ValueError, match="c must be finite and > 0"):
            check_positive_float("c", bad)
    for bad in [True, torch.tensor(0.5), "0.5"]:
        with pytest.raises(ValueError, match="c must be a Python float, got"):
            check_positive_float("c", bad)
    check_threshold("t", None)
    with pytest.raises(ValueError, match=r"t must be a Python float or None, got bool"):
        check_threshold("t", True)
    with pytest.raises(ValueError, match=r"t must be >= 0 or None \(no clipping\), got nan"):
        check_threshold("t", float("nan"))
    check_unit_interval("g", 1)
    with pytest.raises(ValueError, match=r"g must be in \[0, 1\], got 1.5"):
        check_unit_interval("g", 1.5)


def test_ops_check_shapes_always_and_dtypes_devices_and_hyperparameters_only_with_debug_checks():
    x = torch.zeros(4, 2)
    inputs = {"log_rhos": x, "discounts": x, "rewards": x, "values": x}
    with checks.debug_checks(False):
        assert not checks.DEBUG_CHECKS
        with pytest.raises(ValueError, match=r"bootstrap_value must have the shape of values\[0\]"):
            vtrace_from_importance_weights(**inputs, bootstrap_value=torch.zeros(3))
        with pytest.raises(ValueError, match="targets must have the shape of values"):
            value_loss(x, torch.zeros(4, 3))
        # What config validation guarantees is not checked again on every call.
        vtrace_from_importance_weights(**inputs, bootstrap_value=torch.zeros(2), lambda_=1.5)
        value_loss(x, x.double())
        with checks.debug_checks():
            assert checks.DEBUG_CHECKS
            with pytest.raises(ValueError, match=r"lambda_ must be in \[0, 1\]"):
                vtrace_from_importance_weights(**inputs, bootstrap_value=torch.zeros(2), lambda_=1.5)
            with pytest.raises(ValueError, match="targets must have the dtype of values"):
                value_loss(x, x.double())
        assert not checks.DEBUG_CHECKS
