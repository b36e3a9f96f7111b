"""RMSpropTF against a float64 reference written from TensorFlow 1's update rule."""
import numpy as np
import pytest
import torch

from impactrl.ops.rmsprop import RMSpropTF


def reference_rmsprop_tf(theta, grads, lrs, alpha, eps, momentum):
    ms, mom = np.ones_like(theta), np.zeros_like(theta)
    for g, lr in zip(grads, lrs):
        ms = alpha * ms + (1 - alpha) * g * g
        mom = momentum * mom + lr * g / np.sqrt(ms + eps)
        theta = theta - mom
    return theta


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_tf_matches_tensorflows_update_rule(momentum):
    rng = np.random.default_rng(0)
    theta = rng.normal(size=(3, 5))
    grads = [rng.normal(scale=scale, size=(3, 5)) for scale in (0.01, 1.0, 30.0, 0.001, 5.0)]
    lrs = [6e-4, 5e-4, 4e-4, 3e-4, 2e-4]  # an annealed learning rate, as the learner sets it
    param = torch.nn.Parameter(torch.tensor(theta, dtype=torch.float64))
    optimizer = RMSpropTF([param], lr=lrs[0], alpha=0.99, eps=0.01, momentum=momentum)
    for g, lr in zip(grads, lrs):
        optimizer.param_groups[0]["lr"] = lr
        param.grad = torch.tensor(g)
        optimizer.step()
    expected = reference_rmsprop_tf(theta, grads, lrs, 0.99, 0.01, momentum)
    np.testing.assert_allclose(param.detach().numpy(), expected, rtol=1e-12, atol=1e-15)


def test_rmsprop_tf_first_step_is_small_and_its_state_round_trips():
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = RMSpropTF([param], lr=1e-3)
    param.grad = torch.full((4,), 1e-3)
    optimizer.step()
    # Mean square from 1: the first step is about lr·g, where torch.optim.RMSprop steps lr·g/(|g|·0.1 + ε).
    assert float(param.detach().abs().max()) < 1e-5
    restored = RMSpropTF([torch.nn.Parameter(param.detach().clone())], lr=1e-3)
    restored.load_state_dict(optimizer.state_dict())
    assert torch.equal(restored.state[restored.param_groups[0]["params"][0]]["square_avg"],
                       optimizer.state[param]["square_avg"])
