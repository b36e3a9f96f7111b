"""Tests for impactrl.ops.gae and impactrl.ops.policy_losses.

GAE is checked against an independent float64 numpy reference written as the explicit sum of
Schulman et al. 2016 (arXiv 1506.02438) eq. (16), not the backward recursion:

    Â_t = Σ_{l=0}^{T−1−t} ( Π_{i=t}^{t+l−1} λ γ_i ) δ_{t+l},
    δ_t = r_t + γ_t V(x_{t+1}) − V(x_t),

(with γ_t = γ(1 − done) this is Σ_l (γλ)^l δ_{t+l} cut at episode ends). The surrogate losses are
checked on small examples whose expected numbers are worked out by hand in the comments.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from impactrl.ops.gae import GAEReturns, generalized_advantage_estimation
from impactrl.ops.policy_losses import (
    adaptive_kl_coefficient,
    impact_surrogate,
    ppo_clipped_surrogate,
    value_loss,
)
from impactrl.ops.returns import discounted_returns


FAST = settings(max_examples=40, deadline=None)
DTYPES = [torch.float32, torch.float64]


def t64(*xs):
    return torch.tensor(xs, dtype=torch.float64)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------------


def reference_gae(rewards, values, bootstrap, discounts, lam):
    """float64 numpy explicit sum of eq. (16) with per-step cuts where γ_t = 0."""
    r = np.asarray(rewards, np.float64)
    v = np.asarray(values, np.float64)
    g = np.asarray(discounts, np.float64)
    T = r.shape[0]
    v_next = np.concatenate([v[1:], np.asarray(bootstrap, np.float64)[None]], axis=0)
    delta = r + g * v_next - v
    adv = np.zeros_like(v)
    for t in range(T):
        for k in range(T - t):
            coeff = np.ones_like(v[0])
            for i in range(t, t + k):
                coeff = coeff * lam * g[i]
            adv[t] += coeff * delta[t + k]
    return adv, adv + v


def random_episode_inputs(rng, T, B, gamma, dtype):
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    bootstrap = rng.normal(size=(B,))
    terminated = rng.random((T, B)) < 0.15
    truncated = (rng.random((T, B)) < 0.15) & ~terminated
    discounts = gamma * (1.0 - (terminated | truncated))
    to = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    return (to(rewards), to(values), to(bootstrap), to(discounts))


@FAST
@given(
    T=st.integers(1, 7),
    B=st.integers(1, 3),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31 - 1),
    dtype=st.sampled_from(DTYPES),
)
def test_gae_matches_explicit_sum(T, B, gamma, lam, seed, dtype):
    rng = np.random.default_rng(seed)
    rewards, values, bootstrap, discounts = random_episode_inputs(rng, T, B, gamma, dtype)
    out = generalized_advantage_estimation(rewards, values, bootstrap, discounts, lam)
    assert isinstance(out, GAEReturns)
    exp_adv, exp_ret = reference_gae(rewards, values, bootstrap, discounts, lam)
    assert out.advantages.dtype == dtype and out.advantages.shape == (T, B)
    np.testing.assert_allclose(out.advantages.numpy(), exp_adv, **tol(dtype))
    np.testing.assert_allclose(out.returns.numpy(), exp_ret, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_lambda_one_is_discounted_return_minus_value(dtype):
    rng = np.random.default_rng(0)
    rewards, values, bootstrap, discounts = random_episode_inputs(rng, 9, 4, 0.97, dtype)
    out = generalized_advantage_estimation(rewards, values, bootstrap, discounts, 1.0)
    expected = discounted_returns(rewards, discounts, bootstrap)
    torch.testing.assert_close(out.returns, expected, **tol(dtype))
    torch.testing.assert_close(out.advantages, expected - values, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gae_lambda_zero_is_td_error(dtype):
    rng = np.random.default_rng(1)
    rewards, values, bootstrap, discounts = random_episode_inputs(rng, 6, 3, 0.9, dtype)
    out = generalized_advantage_estimation(rewards, values, bootstrap, discounts, 0.0)
    values_tp1 = torch.cat([values[1:], bootstrap[None]])
    torch.testing.assert_close(out.advantages, rewards + discounts * values_tp1 - values)


def test_gae_hand_example():
    # T = 3, B = 1, γ = 0.5, λ = 0.5, no episode end: r = [1, 0, 2], V = [0, 1, 0], V(x_3) = 4.
    # δ = [1 + 0.5·1 − 0, 0 + 0.5·0 − 1, 2 + 0.5·4 − 0] = [1.5, −1, 4]
    # Â_2 = 4; Â_1 = −1 + 0.25·4 = 0; Â_0 = 1.5 + 0.25·0 = 1.5.
    r = torch.tensor([[1.0], [0.0], [2.0]], dtype=torch.float64)
    v = torch.tensor([[0.0], [1.0], [0.0]], dtype=torch.float64)
    out = generalized_advantage_estimation(
        r, v, torch.tensor([4.0], dtype=torch.float64), torch.full_like(r, 0.5), 0.5
    )
    torch.testing.assert_close(out.advantages[:, 0], t64(1.5, 0.0, 4.0))
    torch.testing.assert_close(out.returns[:, 0], t64(1.5, 1.0, 4.0))


def test_gae_no_gradient():
    values = torch.randn(5, 2, requires_grad=True)
    rewards = torch.randn(5, 2, requires_grad=True)
    bootstrap = torch.randn(2, requires_grad=True)
    discounts = torch.full((5, 2), 0.9)
    out = generalized_advantage_estimation(rewards, values, bootstrap, discounts, 0.95)
    assert not out.advantages.requires_grad and not out.returns.requires_grad
    assert out.advantages.grad_fn is None and out.returns.grad_fn is None


def test_gae_trailing_dims_broadcast():
    rng = np.random.default_rng(3)
    rewards = torch.tensor(rng.normal(size=(4, 2, 3)))
    values = torch.tensor(rng.normal(size=(4, 2, 3)))
    bootstrap = torch.tensor(rng.normal(size=(2, 3)))
    discounts = torch.full((4, 2, 1), 0.9, dtype=torch.float64)
    out = generalized_advantage_estimation(rewards, values, bootstrap, discounts, 0.8)
    exp_adv, _ = reference_gae(rewards, values, bootstrap, discounts.expand(4, 2, 3), 0.8)
    np.testing.assert_allclose(out.advantages.numpy(), exp_adv, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rewards=torch.zeros(3, 2)), "rewards must have the shape of values"),
        (dict(bootstrap_value=torch.zeros(2, 1)), "bootstrap_value"),
        (dict(bootstrap_value=torch.zeros(3)), "bootstrap_value"),
        (dict(discounts=torch.zeros(3, 2)), "discounts"),
        (dict(discounts=torch.zeros(4)), "discounts"),
        (dict(values=torch.zeros(4)), "values"),
        (dict(rewards=torch.zeros(4, 2, dtype=torch.float64)), "rewards"),
        (dict(rewards=torch.zeros(4, 2, dtype=torch.long)), "rewards"),
        (dict(lambda_=1.5), "lambda_"),
        (dict(lambda_=torch.tensor(0.5)), "lambda_"),
    ],
)
@pytest.mark.usefixtures("debug_checks")
def test_gae_validation(kwargs, match):
    args = dict(
        rewards=torch.zeros(4, 2),
        values=torch.zeros(4, 2),
        bootstrap_value=torch.zeros(2),
        discounts=torch.zeros(4, 2),
        lambda_=0.9,
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        generalized_advantage_estimation(**args)


# --------------------------------------------------------------------------------------------
# PPO clipped surrogate
# --------------------------------------------------------------------------------------------


def ppo_example():
    # ε = 0.2, ratios r = [1.5, 0.5, 1.1], advantages Â = [1, −2, 3]:
    #   t=0: min(1.5·1, 1.2·1)    = 1.2    (clipped, no gradient)
    #   t=1: min(0.5·−2, 0.8·−2)  = −1.6   (clipped, no gradient)
    #   t=2: min(1.1·3, 1.1·3)    = 3.3    (inside the clip range)
    # loss = −(1.2 − 1.6 + 3.3)/3 = −2.9/3; clip fraction = 2/3;
    # d loss/d log_prob = −[0, 0, r_2·Â_2]/3 = [0, 0, −1.1].
    old = t64(-1.0, -0.5, -2.0)
    log_prob = (old + t64(math.log(1.5), math.log(0.5), math.log(1.1))).requires_grad_(True)
    return log_prob, old, t64(1.0, -2.0, 3.0)


def test_ppo_hand_example():
    log_prob, old, adv = ppo_example()
    loss, clip_fraction = ppo_clipped_surrogate(log_prob, old, adv, 0.2)
    assert loss.item() == pytest.approx(-2.9 / 3, abs=1e-12)
    assert clip_fraction.item() == pytest.approx(2 / 3, abs=1e-12)
    assert not clip_fraction.requires_grad
    loss.backward()
    torch.testing.assert_close(log_prob.grad, t64(0.0, 0.0, -1.1))


def test_ppo_pessimistic_below_range():
    # r = 0.5 < 1 − ε with Â > 0: min picks r·Â = 0.5 (unclipped), gradient flows.
    log_prob = t64(math.log(0.5)).requires_grad_(True)
    loss, cf = ppo_clipped_surrogate(log_prob, t64(0.0), t64(1.0), 0.2)
    assert loss.item() == pytest.approx(-0.5)
    assert cf.item() == 1.0
    loss.backward()
    assert log_prob.grad.item() == pytest.approx(-0.5)


# --------------------------------------------------------------------------------------------
# IMPACT surrogate
# --------------------------------------------------------------------------------------------


def impact_example():
    # ε = 0.4, ρ = 2. Probabilities (μ = behaviour, π_tgt = target, π_θ = learner), Â:
    #   t=0: μ=0.5, π_tgt=0.5, π_θ=0.6,  Â=1:  w=min(1, 2)=1,   r=1·0.6/0.5=1.2
    #        min(1.2, clip(1.2)=1.2)·1 = 1.2                        (inside the clip range)
    #   t=1: μ=0.9, π_tgt=0.3, π_θ=0.36, Â=−1: w=min(3, 2)=2,   r=2·0.36/0.9=0.8
    #        min(−0.8, −0.8) = −0.8                                 (inside)
    #   t=2: μ=0.2, π_tgt=0.4, π_θ=0.8,  Â=2:  w=min(0.5, 2)=0.5, r=0.5·0.8/0.2=2.0
    #        min(4.0, 1.4·2=2.8) = 2.8                              (clipped)
    # loss = −(1.2 − 0.8 + 2.8)/3 = −3.2/3;
    # weights w = [1, 2, 0.5]: mean 7/6, population var (1/36 + 25/36 + 16/36)/3 = 42/108,
    # fraction with μ/π_tgt > ρ = 1/3, PPO clip fraction = 1/3;
    # d loss/d log_prob = −[r_0·Â_0, r_1·Â_1, 0]/3 = [−0.4, 0.8/3, 0].
    behaviour = torch.log(t64(0.5, 0.9, 0.2)).requires_grad_(True)
    target = torch.log(t64(0.5, 0.3, 0.4)).requires_grad_(True)
    log_prob = torch.log(t64(0.6, 0.36, 0.8)).requires_grad_(True)
    return log_prob, target, behaviour, t64(1.0, -1.0, 2.0)


def test_impact_hand_example_and_gradients():
    log_prob, target, behaviour, adv = impact_example()
    loss, stats = impact_surrogate(log_prob, target, behaviour, adv, 0.4, 2.0)
    assert loss.item() == pytest.approx(-3.2 / 3, abs=1e-12)
    assert stats["is_weight_mean"].item() == pytest.approx(7 / 6, abs=1e-12)
    assert stats["is_weight_var"].item() == pytest.approx(42 / 108, abs=1e-12)
    assert stats["is_weight_clipped_fraction"].item() == pytest.approx(1 / 3, abs=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(1 / 3, abs=1e-12)
    assert all(not v.requires_grad for v in stats.values())
    loss.backward()
    torch.testing.assert_close(log_prob.grad, t64(-0.4, 0.8 / 3, 0.0))
    # The clip weight is a constant: no gradient reaches the target or behaviour log-probs.
    for x in (target, behaviour):
        assert x.grad is None or torch.all(x.grad == 0)


def test_impact_hand_example_unclipped_weight():
    # ρ = None: t=1 weight is μ/π_tgt = 3, r = 3·0.36/0.9 = 1.2 = π_θ/π_tgt; with Â = −1:
    # min(−1.2, −1.2) = −1.2 (|1.2 − 1| < 0.4, inside). loss = −(1.2 − 1.2 + 2.8)/3 = −2.8/3.
    log_prob, target, behaviour, adv = impact_example()
    loss, stats = impact_surrogate(log_prob, target, behaviour, adv, 0.4, None)
    assert loss.item() == pytest.approx(-2.8 / 3, abs=1e-12)
    assert stats["is_weight_mean"].item() == pytest.approx(4.5 / 3, abs=1e-12)
    assert stats["is_weight_clipped_fraction"].item() == 0.0


@FAST
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12), eps=st.floats(0.05, 0.5))
def test_impact_without_clip_and_target_equal_behaviour_is_ppo_against_mu(seed, n, eps):
    g = torch.Generator().manual_seed(seed)
    behaviour = torch.randn(n, generator=g, dtype=torch.float64)
    log_prob_data = behaviour + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)

    lp_impact = log_prob_data.clone().requires_grad_(True)
    loss_i, stats = impact_surrogate(lp_impact, behaviour, behaviour, adv, eps, None)
    loss_i.backward()
    lp_ppo = log_prob_data.clone().requires_grad_(True)
    loss_p, cf = ppo_clipped_surrogate(lp_ppo, behaviour, adv, eps)
    loss_p.backward()

    torch.testing.assert_close(loss_i, loss_p)
    torch.testing.assert_close(stats["clip_fraction"], cf)
    torch.testing.assert_close(lp_impact.grad, lp_ppo.grad)
    assert stats["is_weight_mean"].item() == pytest.approx(1.0)
    assert stats["is_weight_var"].item() == pytest.approx(0.0, abs=1e-12)


@FAST
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 12))
def test_impact_unclipped_weight_is_ppo_against_target(seed, n):
    """Whenever μ/π_tgt ≤ ρ (or ρ = None), r = π_θ/π_tgt: PPO with old_log_prob = target."""
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(n, generator=g, dtype=torch.float64)
    behaviour = target - torch.rand(n, generator=g, dtype=torch.float64)  # μ/π_tgt ≤ 1 < ρ
    log_prob = target + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    for rho in (2.0, None):
        loss_i, stats = impact_surrogate(log_prob, target, behaviour, adv, 0.3, rho)
        loss_p, cf = ppo_clipped_surrogate(log_prob, target, adv, 0.3)
        torch.testing.assert_close(loss_i, loss_p)
        torch.testing.assert_close(stats["clip_fraction"], cf)
        assert stats["is_weight_clipped_fraction"].item() == 0.0


# --------------------------------------------------------------------------------------------
# Value loss
# --------------------------------------------------------------------------------------------


def test_value_loss_unclipped_hand():
    # V = [1, 2, 3], R = [1.5, 0, 3]: 0.5·(0.25 + 4 + 0)/3 = 4.25/6.
    values = t64(1.0, 2.0, 3.0).requires_grad_(True)
    targets = t64(1.5, 0.0, 3.0)
    loss = value_loss(values, targets)
    assert loss.item() == pytest.approx(4.25 / 6, abs=1e-12)
    loss.backward()
    torch.testing.assert_close(values.grad, (values.detach() - targets) / 3)
    # old_values without clip_param is ignored.
    ignored = value_loss(values, targets, old_values=t64(0.0, 0.0, 0.0))
    assert ignored.item() == pytest.approx(4.25 / 6)


def test_value_loss_clipped_hand():
    # V_old = [0.5, 1, 2], ε = 0.2: V_clip = V_old + clamp(V − V_old, ±0.2) = [0.7, 1.2, 2.2]
    # (V_clip − R)² = [0.64, 1.44, 0.64]; (V − R)² = [0.25, 4, 0]; max = [0.64, 4, 0.64]
    # loss = 0.5·5.28/3 = 0.88.
    values = t64(1.0, 2.0, 3.0).requires_grad_(True)
    loss = value_loss(values, t64(1.5, 0.0, 3.0), old_values=t64(0.5, 1.0, 2.0), clip_param=0.2)
    assert loss.item() == pytest.approx(0.88, abs=1e-12)
    loss.backward()
    # Steps 0 and 2 take the clipped branch (constant in V): only step 1 has a gradient, 2/3.
    torch.testing.assert_close(values.grad, t64(0.0, 2.0 / 3, 0.0))


@pytest.mark.usefixtures("debug_checks")
def test_value_loss_validation():
    values, targets = t64(1.0, 2.0, 3.0), t64(1.5, 0.0, 3.0)
    with pytest.raises(ValueError, match="old_values"):
        value_loss(values, targets, clip_param=0.2)
    with pytest.raises(ValueError, match="targets"):
        value_loss(values, t64(1.0, 2.0))
    with pytest.raises(ValueError, match="clip_param"):
        value_loss(values, targets, old_values=values, clip_param=-1.0)


# --------------------------------------------------------------------------------------------
# Adaptive KL coefficient
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kl,expected",
    [
        (0.03, 1.5),  # > 2·target: β ← 1.5β
        (0.004, 0.5),  # < 0.5·target: β ← 0.5β
        (0.01, 1.0),  # in between: unchanged
        (0.02, 1.0),  # boundary 2·target (not strictly greater): unchanged
        (0.005, 1.0),  # boundary 0.5·target: unchanged
        (float("nan"), 1.0),
    ],
)
def test_adaptive_kl_coefficient(kl, expected):
    out = adaptive_kl_coefficient(1.0, kl, 0.01)
    assert isinstance(out, float)
    assert out == pytest.approx(expected)
    # The learner's form: β and the KL as tensors (float64 here), the same β without a host read.
    on_device = adaptive_kl_coefficient(torch.tensor(1.0, dtype=torch.float64), torch.tensor(kl, dtype=torch.float64),
                                        0.01)
    assert isinstance(on_device, torch.Tensor) and on_device.shape == () and float(on_device) == out


@pytest.mark.usefixtures("debug_checks")
def test_adaptive_kl_coefficient_validation():
    with pytest.raises(ValueError, match="kl_target"):
        adaptive_kl_coefficient(1.0, 0.01, 0.0)
    with pytest.raises(ValueError, match="coefficient"):
        adaptive_kl_coefficient(-1.0, 0.01, 0.01)
    with pytest.raises(ValueError, match="coefficient"):
        adaptive_kl_coefficient(-1.0, torch.tensor(0.01), 0.01)
    with pytest.raises(ValueError, match="kl"):
        adaptive_kl_coefficient(1.0, torch.zeros(2), 0.01)


# --------------------------------------------------------------------------------------------
# Surrogate validation
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("debug_checks")
def test_surrogate_validation():
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="old_log_prob"):
        ppo_clipped_surrogate(x, torch.zeros(2), x, 0.2)
    with pytest.raises(ValueError, match="clip_param"):
        ppo_clipped_surrogate(x, x, x, 0.0)
    with pytest.raises(ValueError, match="advantages"):
        ppo_clipped_surrogate(x, x, torch.zeros(3, dtype=torch.float64), 0.2)
    with pytest.raises(ValueError, match="target_worker_clip"):
        impact_surrogate(x, x, x, x, 0.2, 0.0)
    with pytest.raises(ValueError, match="behaviour_log_prob"):
        impact_surrogate(x, x, torch.zeros(3, 1), x, 0.2, 2.0)
