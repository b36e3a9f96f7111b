"""The learner's optimisers: RMSpropTF against a float64 reference written from TensorFlow 1's
update rule, RMSpropTorch against torch.optim.RMSprop, and each one's skip on ``found_inf``."""
import copy
import dataclasses

import numpy as np
import pytest
import torch

from impactrl.algos.base import load_optimizer_state, make_optimizer
from impactrl.config import TrainConfig
from impactrl.ops.rmsprop import RMSpropTF, RMSpropTorch


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


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_rmsprop_torch_steps_as_torch_optim_rmsprop_and_takes_its_state(momentum):
    generator = torch.Generator().manual_seed(0)
    theta = torch.randn(3, 5, dtype=torch.float64, generator=generator)
    grads = [scale * torch.randn(3, 5, dtype=torch.float64, generator=generator) for scale in (0.01, 1.0, 30.0, 1e-3)]
    ours, theirs = torch.nn.Parameter(theta.clone()), torch.nn.Parameter(theta.clone())
    settings = {"lr": 5e-4, "alpha": 0.99, "eps": 0.01, "momentum": momentum}
    optimizers = RMSpropTorch([ours], **settings), torch.optim.RMSprop([theirs], **settings, foreach=True)
    for step, g in enumerate(grads):
        for param, optimizer in zip((ours, theirs), optimizers):
            optimizer.param_groups[0]["lr"] = 5e-4 / (step + 1)
            param.grad = g.clone()
            optimizer.step()
    torch.testing.assert_close(ours, theirs, rtol=1e-13, atol=0.0)
    # A checkpoint written by torch.optim.RMSprop (runs from before RMSpropTorch) loads and steps alike.
    resumed = RMSpropTorch([torch.nn.Parameter(theirs.detach().clone())], **settings)
    resumed.load_state_dict(copy.deepcopy(optimizers[1].state_dict()))  # not the same state tensors
    for param, optimizer in zip((resumed.param_groups[0]["params"][0], theirs), (resumed, optimizers[1])):
        param.grad = grads[0].clone()
        optimizer.step()
    torch.testing.assert_close(resumed.param_groups[0]["params"][0], theirs, rtol=1e-13, atol=0.0)


@pytest.mark.parametrize("name", ["adam", "rmsprop", "rmsprop_tf"])
def test_a_step_flagged_found_inf_leaves_parameters_and_state_untouched(name):
    """The learner's skip of a non-finite update, decided on the device: a NaN gradient under
    found_inf = 1 changes nothing, and the steps after it are those of a run without it."""
    config = dataclasses.replace(TrainConfig(), optimizer=name, rmsprop_momentum=0.5 if name != "adam" else 0.0)
    torch.manual_seed(0)
    net = torch.nn.Linear(6, 3)
    runs = []
    for with_skip in (False, True):
        model = copy.deepcopy(net)
        optimizer = make_optimizer(config, model.parameters())
        generator = torch.Generator().manual_seed(1)
        for step in range(4):
            if with_skip and step == 2:
                before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
                for p in model.parameters():
                    p.grad = torch.full_like(p, float("nan"))
                optimizer.found_inf = torch.ones(())
                optimizer.step()
                after = (model.state_dict(), optimizer.state_dict())
                assert all(torch.equal(before[0][key], after[0][key]) for key in before[0])
                for index, state in before[1]["state"].items():
                    assert all(torch.equal(value, after[1]["state"][index][key]) for key, value in state.items())
            for p in model.parameters():
                p.grad = torch.randn(p.shape, generator=generator)
            optimizer.found_inf = torch.zeros(())
            optimizer.step()
        runs.append(model)
    for taken, skipped in zip(runs[0].parameters(), runs[1].parameters()):
        assert torch.equal(taken, skipped)


def test_a_checkpoint_of_foreach_adam_resumes_in_fused_adam_with_its_skip():
    """Runs from before fused Adam saved foreach Adam's flags and CPU step counts: they load, and
    the loaded optimiser still reads found_inf (foreach Adam would refuse it)."""
    config = dataclasses.replace(TrainConfig(), optimizer="adam", adam_eps=1e-5)
    torch.manual_seed(0)
    theirs = torch.nn.Linear(4, 3)
    old = torch.optim.Adam(theirs.parameters(), lr=1e-3, eps=1e-5, foreach=True)
    ours = copy.deepcopy(theirs)
    for p in theirs.parameters():
        p.grad = torch.randn_like(p)
    old.step()
    ours.load_state_dict(theirs.state_dict())
    optimizer = make_optimizer(config, ours.parameters())
    load_optimizer_state(optimizer, copy.deepcopy(old.state_dict()), config)
    for param, other in zip(ours.parameters(), theirs.parameters()):
        param.grad, other.grad = torch.ones_like(param), torch.ones_like(other)
    optimizer.found_inf = torch.zeros(())
    optimizer.step()
    old.step()
    for param, other in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(param, other)
