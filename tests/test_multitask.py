"""Several tasks for one agent: task assignment, padded envs, per-task heads, PopArt."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from impactrl.build import run_tasks
from impactrl.checkpoint import load_checkpoint, save_checkpoint
from impactrl.config import TrainConfig
from impactrl.envs.tasks import SUITES, assign_tasks, check_tasks, task_labels
from impactrl.errors import UserError
from impactrl.models import AgentInput
from impactrl.models.heads import PopArtValueHead, TaskCategoricalHead
from impactrl.ops.popart import art_update, pop_preserve, popart_sigma
from impactrl.plotting import plot_runs
from impactrl.training import build_learner
from conftest import collect, run_cli
from test_runtime import read_metrics

# Breakout: 4 channels, 3 actions; Seaquest: 10 channels, 6 actions.
TWO_TASKS = TrainConfig(algo="impala", env="MinAtar/Breakout-v1,MinAtar/Seaquest-v1", num_actors=1, envs_per_actor=4,
                        unrolls_per_batch=4, unroll_length=12, popart=True, popart_beta=0.3, seed=3)


# ------------------------------------------------------------------------------------ ops


def test_popart_ops_match_a_float64_reference():
    rng = np.random.default_rng(0)
    K, F = 4, 5
    mu, nu = rng.normal(size=K), rng.uniform(1.0, 3.0, size=K)
    targets, task = rng.normal(2.0, 4.0, size=(6, 7)), rng.integers(0, K - 1, size=(6, 7))  # task K-1 absent
    beta = 0.1
    new_mu, new_nu = mu.copy(), nu.copy()
    for k in range(K):
        if (task == k).any():
            new_mu[k] = (1 - beta) * mu[k] + beta * targets[task == k].mean()
            new_nu[k] = (1 - beta) * nu[k] + beta * (targets[task == k] ** 2).mean()
    got_mu, got_nu = art_update(torch.tensor(mu), torch.tensor(nu), torch.tensor(targets), torch.tensor(task), beta)
    np.testing.assert_allclose(got_mu.numpy(), new_mu, rtol=1e-12)
    np.testing.assert_allclose(got_nu.numpy(), new_nu, rtol=1e-12)
    sigma = np.clip(np.sqrt(np.maximum(nu - mu**2, 0)), 1e-4, 1e6)
    np.testing.assert_allclose(popart_sigma(torch.tensor(mu), torch.tensor(nu), 1e-4, 1e6).numpy(), sigma)
    new_sigma = np.clip(np.sqrt(np.maximum(new_nu - new_mu**2, 0)), 1e-4, 1e6)
    w, b = rng.normal(size=(K, F)), rng.normal(size=K)
    got_w, got_b = pop_preserve(*(torch.tensor(x) for x in (w, b, mu, sigma, new_mu, new_sigma)))
    h = rng.normal(size=(9, F))
    np.testing.assert_allclose((h @ got_w.numpy().T + got_b.numpy()) * new_sigma + new_mu,
                               (h @ w.T + b) * sigma + mu, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("trial", range(20))
def test_popart_update_preserves_unnormalised_values(trial):
    """Property: for random statistics and targets, ART + POP leave V = σ n + μ unchanged."""
    generator = torch.Generator().manual_seed(trial)
    K = 3
    head = PopArtValueHead(8, K, beta=float(torch.rand((), generator=generator)) * 0.5 + 1e-3)
    scale = 10.0 ** (torch.rand(K, generator=generator) * 6 - 2)  # σ from 0.01 to 1e4
    with torch.no_grad():
        head.mu.copy_(torch.randn(K, generator=generator) * scale)
        head.nu.copy_(head.mu.square() + scale.square())
    features = torch.randn(5, 6, 8, generator=generator)
    task = torch.randint(0, K, (5, 6), generator=generator)
    before = head.unnormalize(head(features).gather(-1, task[..., None]).squeeze(-1), task)
    targets = torch.randn(5, 6, generator=generator) * scale[task] * 3 + 5 * scale[task]
    head.update(targets, task)
    after = head.unnormalize(head(features).gather(-1, task[..., None]).squeeze(-1), task)
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5 * float(scale.max()))
    assert not torch.equal(head.mu, torch.zeros(K))


# ------------------------------------------------------------------------------------ heads


def test_invalid_actions_are_never_sampled_and_have_zero_probability():
    head = TaskCategoricalHead(6, (3, 6, 2))
    task = torch.tensor([0, 1, 2]).repeat(20_000)
    features = torch.randn(len(task), 6) * 50  # large logits: masking, not luck, keeps them out
    params = head(features, task)
    actions, log_prob = head.sample_with_log_prob(params)
    counts = torch.tensor((3, 6, 2))[task]
    assert (actions < counts).all()
    assert torch.isfinite(log_prob).all()
    invalid = torch.arange(6)[None, :] >= counts[:, None]
    assert (torch.log_softmax(params, -1).exp()[invalid] == 0).all()
    assert (head.log_prob(params, torch.full_like(task, 5))[task != 1] == float("-inf")).all()
    assert torch.isfinite(head.entropy(params)).all() and torch.isfinite(head.kl(params, params.flip(0))).all()
    assert (head.mode(params) < counts).all()


def test_a_tasks_loss_sends_no_gradient_into_the_other_tasks_heads():
    config = dataclasses.replace(TWO_TASKS, env="minatar")
    learner, _ = build_learner(config, None)
    agent = learner.agent
    obs = torch.randint(0, 2, (3, 4, 10, 10, 10), dtype=torch.uint8)
    inputs = AgentInput(obs, torch.zeros(3, 4, dtype=torch.int64), torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.bool),
                        torch.full((3, 4), 2))
    output, _ = agent(inputs, ())
    (output.policy.logsumexp(-1).sum() + output.value.sum()).backward()
    num_actions = agent.policy_head.num_actions
    policy_grad = agent.policy_head.linear.weight.grad.unflatten(0, (5, num_actions))
    value_grad = agent.value_head.linear.weight.grad
    for task in (0, 1, 3, 4):
        assert torch.count_nonzero(policy_grad[task]) == 0 and torch.count_nonzero(value_grad[task]) == 0
    assert torch.count_nonzero(policy_grad[2]) > 0 and torch.count_nonzero(value_grad[2]) > 0
    assert agent.torso.parameters().__next__().grad.abs().sum() > 0


# ------------------------------------------------------------------------------------ tasks


def test_tasks_are_dealt_round_robin_or_by_weight():
    assert assign_tasks(5, 2, 5).tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    weighted = assign_tasks(3, 2, 6, (2.0, 1.0, 1.0))
    assert np.bincount(weighted.ravel()).tolist() == [6, 3, 3]
    assert set(weighted[0]) == {0, 1, 2}  # every actor plays a mix
    assert np.bincount(assign_tasks(3, 1, 4, (100.0, 1.0, 1.0)).ravel()).tolist() == [2, 1, 1]  # at least one each
    with pytest.raises(UserError, match="5 tasks need at least 5 envs"):
        assign_tasks(5, 2, 2)


def test_task_lists_are_checked():
    assert check_tasks("minatar") == SUITES["minatar"]
    assert task_labels(SUITES["minatar"])[1] == "Breakout"
    with pytest.raises(UserError, match="more than once"):
        check_tasks("MinAtar/Breakout-v1,MinAtar/Breakout-v1")
    with pytest.raises(UserError, match="one env family"):
        check_tasks("MinAtar/Breakout-v1,CartPole-v1")
    with pytest.raises(UserError, match="did you mean"):
        check_tasks("MinAtar/Breakout-v1,MinAtar/Brekout-v1")
    with pytest.raises(UserError, match="did you mean the suite 'minatar'"):
        check_tasks("minatr")
    atari = run_tasks(TrainConfig(env="ALE/Pong-v5,ALE/Breakout-v5"))
    assert atari.num_actions == (6, 4) and atari.observation_space.shape == (4, 84, 84)
    with pytest.raises(UserError, match="need Discrete actions"):
        run_tasks(TrainConfig(env="CartPole-v1,Pendulum-v1"))


# ------------------------------------------------------------------------------------ training


@pytest.mark.parametrize("algo", ["impala", "impact"])
def test_a_mixed_batch_of_two_tasks_trains_and_popart_survives_a_checkpoint(algo, tmp_path):
    config = dataclasses.replace(TWO_TASKS, algo=algo, optimizer="adam", learning_rate=1e-3)
    learner, batches = collect(config, slots=3)
    batch = batches[0]
    assert batch["task"][0].tolist() == [0, 1, 0, 1]
    breakout_obs = batch["obs"][:, batch["task"][0] == 0]
    assert breakout_obs[:, :, 4:].sum() == 0 and breakout_obs[:, :, :4].sum() > 0  # 4 channels, zero-padded to 10
    assert (batch["action"][:, batch["task"][0] == 0] < 3).all()
    head = learner.agent.value_head
    for batch in batches:
        learner.add(batch)
        stats = learner.update()
        assert stats is not None and torch.isfinite(stats["loss/baseline"])
    assert (head.mu != 0).all() and not torch.equal(head.nu, torch.ones(2))  # both tasks' statistics moved
    save_checkpoint(tmp_path, learner.state_dict(), "ckpt_0000000003", keep=2)
    restored, _ = build_learner(config, load_checkpoint(tmp_path))
    with torch.no_grad():
        from impactrl.algos.common import agent_outputs

        before, after = agent_outputs(learner.agent, batch), agent_outputs(restored.agent, batch)
    torch.testing.assert_close(after.value, before.value, rtol=0, atol=0)
    torch.testing.assert_close(after.normalized_value, before.normalized_value, rtol=0, atol=0)
    mu, sigma = restored.agent.value_head.statistics(batch["task"], after.value.shape)
    torch.testing.assert_close(after.value, sigma * after.normalized_value + mu)


@pytest.mark.slow
def test_train_eval_and_plot_a_suite_with_popart(run_dir):
    run_cli("train", "--env", "minatar", "--popart", "--num-actors", "2", "--envs-per-actor", "5", "--unrolls-per-batch", "10",
            "--total-env-steps", "12000", "--log-interval-s", "1", "--out", str(run_dir), check=True)
    records = read_metrics(run_dir)
    last = records[-1]
    assert sorted(last["task"]) == sorted(task_labels(SUITES["minatar"]))
    assert sum(task["env_steps"] for task in last["task"].values()) == last["env_steps"]
    # Learner statistics are the interval's: the final line may follow the previous one too soon to hold any.
    assert any("popart/sigma_mean" in record for record in records)
    assert 0.0 <= last["torso/dead_units_first_layer"] <= last["torso/dead_units_worst_layer"] <= 1.0
    evaluation = json.loads(run_cli("eval", str(run_dir), "--episodes", "1", check=True).stdout)
    assert set(evaluation["tasks"]) == set(last["task"]) and evaluation["score"] is None
    assert all("random_return_mean" in task for task in evaluation["tasks"].values())
    assert all(len(task["torso_dead_units"]) == 2 for task in evaluation["tasks"].values())  # MinAtar: conv, fc
    assert plot_runs([run_dir], run_dir / "curves.png").stat().st_size > 0
