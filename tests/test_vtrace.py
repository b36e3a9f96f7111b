"""Tests for impactrl.ops.vtrace and impactrl.ops.returns.

The ground truth is an independent float64 numpy reference written as the literal double sum of
Espeholt et al. 2018 (arXiv 1802.01561) eq. (1), not the backward recursion:

    v_s = V(x_s) + Σ_{t=s}^{T−1} ( Π_{i=s}^{t−1} γ_i c_i ) δ_t,
    δ_t = ρ_t (r_t + γ_t V(x_{t+1}) − V(x_t)),
    A_s = ρ^pg_s (r_s + γ_s v_{s+1} − V(x_s)).

Cases 2–5 port DeepMind's scalable_agent ``vtrace_test.py`` (docs/algorithms.md#v-trace-reference-tests).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from impactrl.ops.returns import bootstrap_truncations, discounted_returns, explained_variance
from impactrl.ops.vtrace import VTraceReturns, vtrace_from_importance_weights


DTYPES = [torch.float32, torch.float64]


# --------------------------------------------------------------------------------------------
# Independent numpy reference (float64, eq. (1) as a double sum)
# --------------------------------------------------------------------------------------------


def reference_vtrace(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold=1.0,
    clip_pg_rho_threshold=1.0,
    clip_c_threshold=1.0,
    lambda_=1.0,
):
    """Literal eq. (1) in float64 numpy; returns (vs, pg_advantages) with the shape of values."""
    f = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
    log_rhos, discounts, rewards, values, bootstrap_value = map(
        f, (log_rhos, discounts, rewards, values, bootstrap_value)
    )
    shape = values.shape
    rhos = np.exp(log_rhos)
    clip = lambda x, c: x if c is None else np.minimum(c, x)  # noqa: E731
    rho = np.broadcast_to(clip(rhos, clip_rho_threshold), shape)
    cs = np.broadcast_to(lambda_ * clip(rhos, clip_c_threshold), shape)
    pg_rho = np.broadcast_to(clip(rhos, clip_pg_rho_threshold), shape)
    gamma = np.broadcast_to(discounts, shape)
    T = shape[0]

    def v_of(t):  # V(x_t), with V(x_T) = bootstrap
        return values[t] if t < T else bootstrap_value

    delta = [rho[t] * (rewards[t] + gamma[t] * v_of(t + 1) - values[t]) for t in range(T)]
    vs = np.zeros(shape)
    for s in range(T):
        total = np.array(values[s], dtype=np.float64)
        for t in range(s, T):
            prod = np.ones(shape[1:])
            for i in range(s, t):
                prod = prod * gamma[i] * cs[i]
            total = total + prod * delta[t]
        vs[s] = total
    vs_tp1 = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg = pg_rho * (rewards + gamma * vs_tp1 - values)
    return vs, pg


def reference_returns(rewards, discounts, bootstrap_value):
    """G_s = Σ_{t≥s} (Π_{i<t} γ_i) r_t + (Π_i γ_i) V(x_T), as an explicit sum."""
    rewards, discounts = np.asarray(rewards, np.float64), np.asarray(discounts, np.float64)
    T = rewards.shape[0]
    out = np.zeros(rewards.shape)
    for s in range(T):
        prod = np.ones(rewards.shape[1:])
        total = np.zeros(rewards.shape[1:])
        for t in range(s, T):
            total = total + prod * rewards[t]
            prod = prod * discounts[t]
        out[s] = total + prod * np.asarray(bootstrap_value, np.float64)
    return out


def assert_close(actual: torch.Tensor, expected, dtype: torch.dtype, rtol=None, atol=None):
    """Compare against a float64 reference; float32 gets rtol 1e-6 / atol 1e-5."""
    if rtol is None:
        rtol = 1e-6 if dtype == torch.float32 else 1e-10
    if atol is None:
        atol = 1e-5 if dtype == torch.float32 else 1e-10
    np.testing.assert_allclose(
        actual.detach().cpu().to(torch.float64).numpy(),
        np.asarray(expected, np.float64),
        rtol=rtol,
        atol=atol,
    )


def t_(x, dtype=torch.float64, device="cpu") -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=dtype, device=device)


def shaped_arange(*shape) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)


def ground_truth_inputs(batch_size: int, T: int = 5):
    """DeepMind's test inputs: ρ straddles both ρ̄ = 3.7 and ρ̄_pg = 2.2 and c̄ = 1."""
    log_rhos = 5.0 * (shaped_arange(T, batch_size) / (T * batch_size) - 0.5)
    discounts = np.array([[0.9 / (b + 1) for b in range(batch_size)] for _ in range(T)])
    rewards = shaped_arange(T, batch_size)
    values = shaped_arange(T, batch_size) / batch_size
    bootstrap_value = shaped_arange(batch_size) + 1.0
    return dict(
        log_rhos=log_rhos,
        discounts=discounts,
        rewards=rewards,
        values=values,
        bootstrap_value=bootstrap_value,
    )


def log_rhos_from_logits(behaviour_logits, target_logits, actions) -> torch.Tensor:
    """log π(a_t|x_t) − log μ(a_t|x_t) for a categorical policy (log-softmax gathered at a_t)."""
    index = actions.unsqueeze(-1)
    target = F.log_softmax(target_logits, dim=-1).gather(-1, index).squeeze(-1)
    return target - F.log_softmax(behaviour_logits, dim=-1).gather(-1, index).squeeze(-1)


def to_torch(inputs: dict, dtype, device="cpu") -> dict:
    return {k: t_(v, dtype, device) for k, v in inputs.items()}


def random_inputs(rng: np.random.Generator, T: int, B: int, *trailing: int) -> dict:
    shape = (T, B, *trailing)
    return dict(
        log_rhos=rng.normal(0.0, 1.0, shape),
        discounts=rng.uniform(0.5, 1.0, shape),
        rewards=rng.normal(0.0, 1.0, shape),
        values=rng.normal(0.0, 1.0, shape),
        bootstrap_value=rng.normal(0.0, 1.0, shape[1:]),
    )


# --------------------------------------------------------------------------------------------
# 2–5. DeepMind's vtrace_test.py
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_size", [1, 5])
def test_vtrace_against_ground_truth(batch_size, dtype):
    inputs = ground_truth_inputs(batch_size)
    rhos = np.exp(inputs["log_rhos"])
    assert rhos.min() < 1.0 and rhos.max() > 3.7  # crosses c̄, ρ̄_pg and ρ̄
    kwargs = dict(clip_rho_threshold=3.7, clip_pg_rho_threshold=2.2)
    out = vtrace_from_importance_weights(**to_torch(inputs, dtype), **kwargs)
    assert isinstance(out, VTraceReturns)
    vs, pg = reference_vtrace(**inputs, **kwargs)
    assert out.vs.shape == (5, batch_size) and out.vs.dtype == dtype
    assert out.pg_advantages.dtype == dtype
    assert_close(out.vs, vs, dtype)
    assert_close(out.pg_advantages, pg, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch_size", [1, 2])
def test_vtrace_with_log_rhos_from_logits(batch_size, dtype):
    T, A = 5, 3
    rng = np.random.default_rng(1)
    behaviour_logits = t_(shaped_arange(T, batch_size, A), dtype)
    noise = rng.normal(size=(T, batch_size, A))
    target_logits = t_(shaped_arange(T, batch_size, A) * 0.5 + noise, dtype)
    actions = torch.as_tensor(rng.integers(0, A, size=(T, batch_size)), dtype=torch.int64)
    base = to_torch(ground_truth_inputs(batch_size, T), dtype)
    base.pop("log_rhos")
    no_clip = dict(clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None)

    log_rhos = log_rhos_from_logits(behaviour_logits, target_logits, actions)
    out = vtrace_from_importance_weights(log_rhos=log_rhos, **base, **no_clip)
    # Against the independent reference, unclipped.
    vs, pg = reference_vtrace(
        log_rhos.numpy(), **{k: v.numpy() for k, v in base.items()},
        clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None,
    )
    assert_close(out.vs, vs, dtype)
    assert_close(out.pg_advantages, pg, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_higher_rank_inputs(dtype):
    T, B, C = 5, 2, 42
    rng = np.random.default_rng(2)
    inputs = dict(
        log_rhos=rng.normal(size=(T, B, 1)),
        discounts=rng.uniform(0.5, 1.0, size=(T, B, 1)),
        rewards=rng.normal(size=(T, B, C)),
        values=rng.normal(size=(T, B, C)),
        bootstrap_value=rng.normal(size=(B, C)),
    )
    out = vtrace_from_importance_weights(**to_torch(inputs, dtype))
    assert out.vs.shape == (T, B, C)
    assert out.pg_advantages.shape == (T, B, C)
    vs, pg = reference_vtrace(**inputs)
    assert_close(out.vs, vs, dtype)
    assert_close(out.pg_advantages, pg, dtype)
    # Each channel equals the rank-2 computation on that channel.
    k = 17
    single = vtrace_from_importance_weights(
        log_rhos=t_(inputs["log_rhos"][..., 0], dtype),
        discounts=t_(inputs["discounts"][..., 0], dtype),
        rewards=t_(inputs["rewards"][..., k], dtype),
        values=t_(inputs["values"][..., k], dtype),
        bootstrap_value=t_(inputs["bootstrap_value"][..., k], dtype),
    )
    torch.testing.assert_close(out.vs[..., k], single.vs)


def test_inconsistent_rank_raises():
    T, B, C = 5, 2, 42
    kwargs = dict(
        log_rhos=torch.zeros(T, B, 1),
        discounts=torch.zeros(T, B, 1),
        rewards=torch.zeros(T, B, C),
        values=torch.zeros(T, B, C),
        bootstrap_value=torch.zeros(B),  # should be [B, C]
    )
    with pytest.raises(ValueError, match=r"bootstrap_value rank must be values rank - 1 = 2"):
        vtrace_from_importance_weights(**kwargs)


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            dict(log_rhos=torch.zeros(5, 2, 1)),
            r"log_rhos rank must equal discounts rank.*\(5, 2, 1\)",
        ),
        (dict(rewards=torch.zeros(5, 3)), r"rewards must have the shape of values.*\(5, 3\)"),
        (dict(bootstrap_value=torch.zeros(3)), r"bootstrap_value must have the shape of values"),
        (dict(log_rhos=torch.zeros(4, 2), discounts=torch.zeros(4, 2)), r"log_rhos must have T"),
        (dict(log_rhos=torch.zeros(5, 3)), r"log_rhos shape \(5, 3\) does not broadcast"),
        (dict(values=torch.zeros(5), rewards=torch.zeros(5)), r"values must be time-major"),
        (dict(rewards=torch.zeros(5, 2, dtype=torch.int64)), r"rewards must be a floating-point"),
        (dict(discounts=torch.zeros(5, 2, dtype=torch.float64)), r"discounts must have the dtype"),
        (dict(clip_rho_threshold=-1.0), r"clip_rho_threshold must be >= 0"),
        (dict(lambda_=1.5), r"lambda_ must be in \[0, 1\]"),
    ],
)
@pytest.mark.usefixtures("debug_checks")
def test_validation_messages(overrides, match):
    kwargs = dict(
        log_rhos=torch.zeros(5, 2),
        discounts=torch.zeros(5, 2),
        rewards=torch.zeros(5, 2),
        values=torch.zeros(5, 2),
        bootstrap_value=torch.zeros(2),
    )
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=match):
        vtrace_from_importance_weights(**kwargs)


# --------------------------------------------------------------------------------------------
# Golden values, λ < 1, on-policy, episode boundaries
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_golden_values(dtype):
    # T = 2, B = 1, worked by hand: ρ = [1 (clipped from 2), 0.5], c = ρ, γ = 0.9.
    # δ_1 = 0.5 (2 + 0.9·3 − 1) = 1.85;  v_1 = 1 + 1.85 = 2.85
    # δ_0 = 1 (1 + 0.9·1 − 0.5) = 1.4;   v_0 = 0.5 + 1.4 + 0.9·1·1.85 = 3.565
    # A_1 = 0.5 (2 + 0.9·3 − 1) = 1.85;  A_0 = 1 (1 + 0.9·2.85 − 0.5) = 3.065
    out = vtrace_from_importance_weights(
        log_rhos=torch.log(torch.tensor([[2.0], [0.5]], dtype=dtype)),
        discounts=torch.full((2, 1), 0.9, dtype=dtype),
        rewards=torch.tensor([[1.0], [2.0]], dtype=dtype),
        values=torch.tensor([[0.5], [1.0]], dtype=dtype),
        bootstrap_value=torch.tensor([3.0], dtype=dtype),
    )
    assert_close(out.vs, [[3.565], [2.85]], dtype)
    assert_close(out.pg_advantages, [[3.065], [1.85]], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lambda_", [0.0, 0.5, 0.95])
def test_lambda_against_reference(lambda_, dtype):
    inputs = ground_truth_inputs(batch_size=3, T=6)
    kwargs = dict(clip_rho_threshold=3.7, clip_pg_rho_threshold=2.2, clip_c_threshold=1.5,
                  lambda_=lambda_)
    out = vtrace_from_importance_weights(**to_torch(inputs, dtype), **kwargs)
    vs, pg = reference_vtrace(**inputs, **kwargs)
    assert_close(out.vs, vs, dtype)
    assert_close(out.pg_advantages, pg, dtype)


def test_lambda_zero_is_one_step_td():
    rng = np.random.default_rng(3)
    inputs = random_inputs(rng, 6, 4)
    out = vtrace_from_importance_weights(**to_torch(inputs, torch.float64), lambda_=0.0)
    i = inputs
    rho = np.minimum(1.0, np.exp(i["log_rhos"]))
    v_tp1 = np.concatenate([i["values"][1:], i["bootstrap_value"][None]])
    expected = i["values"] + rho * (i["rewards"] + i["discounts"] * v_tp1 - i["values"])
    assert_close(out.vs, expected, torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_on_policy_equals_discounted_returns(dtype):
    rng = np.random.default_rng(4)
    T, B = 9, 4
    inputs = random_inputs(rng, T, B)
    inputs["log_rhos"] = np.zeros((T, B))
    inputs["discounts"][3, 1] = 0.0  # an episode end, too
    tin = to_torch(inputs, dtype)
    out = vtrace_from_importance_weights(
        **tin, clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None
    )
    returns = discounted_returns(tin["rewards"], tin["discounts"], tin["bootstrap_value"])
    assert returns.dtype == dtype and returns.shape == (T, B)
    torch.testing.assert_close(out.vs, returns)
    assert_close(returns, reference_returns(inputs["rewards"], inputs["discounts"],
                                            inputs["bootstrap_value"]), dtype)
    # Default thresholds (1.0) give the same result on-policy since ρ = c = 1.
    out_default = vtrace_from_importance_weights(**tin)
    torch.testing.assert_close(out_default.vs, returns)
    # On-policy advantages are G_t − V(x_t).
    torch.testing.assert_close(out.pg_advantages, returns - tin["values"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.integers(2, 12),
    B=st.integers(1, 4),
    data=st.data(),
    seed=st.integers(0, 2**31 - 1),
)
def test_episode_end_cuts_trace(T, B, data, seed):
    """discount 0 at step k: the unroll equals two independent V-traces on [0, k] and (k, T)."""
    k = data.draw(st.integers(0, T - 2), label="k")
    rng = np.random.default_rng(seed)
    inputs = random_inputs(rng, T, B)
    inputs["log_rhos"] = rng.normal(0.0, 1.5, (T, B))
    inputs["discounts"][k] = 0.0
    kwargs = dict(clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0, clip_c_threshold=1.0)
    full = vtrace_from_importance_weights(**to_torch(inputs, torch.float64), **kwargs)

    def piece(sl, bootstrap):
        sub = {key: v[sl] for key, v in inputs.items() if key != "bootstrap_value"}
        return vtrace_from_importance_weights(
            **to_torch(sub, torch.float64), bootstrap_value=t_(bootstrap), **kwargs
        )

    # The first piece's bootstrap is multiplied by discount 0; use anything finite.
    first = piece(slice(0, k + 1), rng.normal(size=B) * 100.0)
    second = piece(slice(k + 1, T), inputs["bootstrap_value"])
    torch.testing.assert_close(full.vs, torch.cat([first.vs, second.vs]), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        full.pg_advantages, torch.cat([first.pg_advantages, second.pg_advantages]),
        rtol=1e-12, atol=1e-12,
    )
    vs, pg = reference_vtrace(**inputs, **kwargs)
    assert_close(full.vs, vs, torch.float64)
    assert_close(full.pg_advantages, pg, torch.float64)


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


def test_no_gradient_into_outputs():
    inputs = to_torch(ground_truth_inputs(batch_size=3), torch.float32)
    for v in inputs.values():
        v.requires_grad_(True)
    out = vtrace_from_importance_weights(**inputs)
    for x in out:
        assert not x.requires_grad
        assert x.grad_fn is None

    T, B, A = 5, 3, 4
    behaviour_logits = torch.randn(T, B, A)
    target_logits = torch.randn(T, B, A, requires_grad=True)
    actions = torch.randint(0, A, (T, B))
    base = {k: v for k, v in inputs.items() if k != "log_rhos"}
    log_rhos = log_rhos_from_logits(behaviour_logits, target_logits, actions)
    assert log_rhos.requires_grad
    out = vtrace_from_importance_weights(log_rhos, **base)
    assert out.vs.grad_fn is None and not out.vs.requires_grad
    assert out.pg_advantages.grad_fn is None and not out.pg_advantages.requires_grad
    # The policy-gradient loss differentiates through the target log-probs only (the behaviour
    # logits carry no gradient, so log_rhos = log π − constant).
    loss = -(log_rhos * out.pg_advantages).sum()
    loss.backward()
    assert target_logits.grad is not None and torch.isfinite(target_logits.grad).all()
    assert inputs["values"].grad is None


# --------------------------------------------------------------------------------------------
# bootstrap_truncations
# --------------------------------------------------------------------------------------------


def test_bootstrap_truncations_hand_example():
    # Columns: 0 terminates at t=1; 1 is truncated at t=1 (V(x_final) = 10);
    # 2 is both terminated and truncated at t=1 (counts as terminated; its 100 is ignored).
    g = 0.9
    nan = float("nan")
    rewards = torch.tensor([[1.0, 1.0, 1.0], [2.0, 1.0, 2.0], [3.0, 1.0, 3.0]])
    terminated = torch.tensor([[False, False, False], [True, False, True], [False, False, False]])
    truncated = torch.tensor([[False, False, False], [False, True, True], [False, False, False]])
    truncation_values = torch.tensor([[nan, nan, nan], [nan, 10.0, 100.0], [nan, nan, nan]])
    r, d = bootstrap_truncations(rewards, terminated, truncated, truncation_values, g)

    expected_r = torch.tensor([[1.0, 1.0, 1.0], [2.0, 10.0, 2.0], [3.0, 1.0, 3.0]])
    torch.testing.assert_close(r, expected_r)
    expected_d = torch.tensor([[0.9, 0.9, 0.9], [0.0, 0.0, 0.0], [0.9, 0.9, 0.9]])
    torch.testing.assert_close(d, expected_d)
    assert r.dtype == d.dtype == torch.float32

    # On-policy V-trace on these outputs; values arbitrary, bootstrap V(x_3) = [5, 7, 5].
    values = torch.tensor([[0.3, -1.0, 0.0], [2.0, 4.0, 0.5], [0.1, 0.2, 0.3]])
    bootstrap = torch.tensor([5.0, 7.0, 5.0])
    out = vtrace_from_importance_weights(
        log_rhos=torch.zeros(3, 3), discounts=d, rewards=r, values=values,
        bootstrap_value=bootstrap,
    )
    # Hand-computed returns:
    #   col 0 (terminated at 1): G_2 = 3 + 0.9·5 = 7.5, G_1 = 2, G_0 = 1 + 0.9·2 = 2.8
    #   col 1 (truncated at 1, V(x_final) = 10): G_2 = 1 + 0.9·7 = 7.3,
    #         G_1 = 1 + 0.9·10 = 10, G_0 = 1 + 0.9·10 = 10
    #   col 2 (terminated and truncated at 1): as col 0.
    expected = torch.tensor([[2.8, 10.0, 2.8], [2.0, 10.0, 2.0], [7.5, 7.3, 7.5]])
    torch.testing.assert_close(out.vs, expected)
    torch.testing.assert_close(out.pg_advantages, expected - values)


@pytest.mark.usefixtures("debug_checks")
def test_bootstrap_truncations_validation():
    z = torch.zeros(3, 2)
    b = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="terminated must be a bool"):
        bootstrap_truncations(z, z, b, z, 0.9)
    with pytest.raises(ValueError, match=r"truncation_values must have the shape of rewards"):
        bootstrap_truncations(z, b, b, torch.zeros(3, 3), 0.9)
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\]"):
        bootstrap_truncations(z, b, b, z, 1.5)


def test_discounted_returns_validation():
    with pytest.raises(ValueError, match=r"bootstrap_value must have the shape of rewards\[0\]"):
        discounted_returns(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3))


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    rng = np.random.default_rng(6)
    inputs = random_inputs(rng, 20, 8, 3)
    inputs["log_rhos"] = rng.normal(0.0, 1.5, (20, 8, 1))
    inputs["discounts"] = inputs["discounts"][..., :1]
    kwargs = dict(clip_rho_threshold=3.7, clip_pg_rho_threshold=2.2, lambda_=0.9)
    cpu = vtrace_from_importance_weights(**to_torch(inputs, dtype), **kwargs)
    gpu = vtrace_from_importance_weights(**to_torch(inputs, dtype, "cuda"), **kwargs)
    assert gpu.vs.device.type == "cuda" and gpu.vs.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gpu.vs.cpu(), cpu.vs, **tol)
    torch.testing.assert_close(gpu.pg_advantages.cpu(), cpu.pg_advantages, **tol)
    tin = to_torch(inputs, dtype, "cuda")
    g = discounted_returns(tin["rewards"], tin["discounts"], tin["bootstrap_value"])
    cin = to_torch(inputs, dtype)
    c = discounted_returns(cin["rewards"], cin["discounts"], cin["bootstrap_value"])
    torch.testing.assert_close(g.cpu(), c, **tol)


def test_explained_variance_against_float64_reference():
    rng = np.random.default_rng(0)
    targets, values = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    expected = 1 - np.var(targets - values) / np.var(targets)
    got = explained_variance(torch.tensor(values), torch.tensor(targets))
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    assert float(explained_variance(torch.tensor(targets), torch.tensor(targets))) == 1.0
