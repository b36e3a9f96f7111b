"""The value error ``impactrl eval`` reports: V(x_t) against the discounted return that followed."""

import json
import math

import numpy as np
import pytest
import torch

from conftest import run_cli
from impactrl.build import env_options, make_agent, run_tasks
from impactrl.config import TrainConfig, with_values
from impactrl.envs import make_env
from impactrl.evaluation import MonteCarloValues, play


def returns_that_followed(rewards: list[float], discounts: list[float], bootstrap: float) -> list[float]:
    """G_t = r_t + γ_t G_{t+1} in float64 Python, written forwards from each t."""
    out = []
    for t in range(len(rewards)):
        total, scale = 0.0, 1.0
        for k in range(t, len(rewards)):
            total += scale * rewards[k]
            scale *= discounts[k]
        out.append(total + scale * bootstrap)
    return out


def test_returns_follow_training_rewards_lives_and_truncations():
    monte_carlo = MonteCarloValues(num_envs=2, discount=0.9, clip_rewards=True, life_ends=True)
    # env 0: rewards clipped to [-1, 1] as in training, terminated at its third step
    for value, reward, terminated in ((0.5, 2.0, False), (0.1, -3.0, False), (0.7, 0.5, True)):
        monte_carlo.step(0, value, reward, terminated, {"lives": 0})
    monte_carlo.end_episode(0, 0.0)
    # env 1: a life lost at its second step ends the discounting there; truncated, bootstrapped from 4.0
    for value, lives in ((1.0, 3), (2.0, 2), (3.0, 2), (4.0, 2)):
        monte_carlo.step(1, value, 1.0, False, {"lives": lives})
    monte_carlo.end_episode(1, 4.0)
    expected = (returns_that_followed([1.0, -1.0, 0.5], [0.9, 0.9, 0.0], 0.0)
                + returns_that_followed([1.0] * 4, [0.9, 0.0, 0.9, 0.9], 4.0))
    values = np.array([0.5, 0.1, 0.7, 1.0, 2.0, 3.0, 4.0])
    summary = monte_carlo.summary()
    assert summary["value_mse"] == pytest.approx(np.mean((values - expected) ** 2), rel=1e-12)
    errors = np.asarray(expected) - values
    assert summary["value_explained_variance"] == pytest.approx(1 - errors.var() / np.var(expected), rel=1e-6)


def test_truncated_episodes_bootstrap_from_their_final_value():
    """A fresh CartPole agent whose value is the constant c, episodes truncated at 5 steps: every
    G_t is Σ γ^k + γ^(5−t) c, so the MSE is known without the agent."""
    config = with_values(TrainConfig(), {"env": "CartPole-v1", "max_episode_steps": 5})
    tasks = run_tasks(config)
    agent = make_agent(config, tasks)
    c = 3.0
    with torch.no_grad():
        agent.value_head.linear.weight.zero_()
        agent.value_head.linear.bias.fill_(c)
    envs = [make_env("CartPole-v1", env_options(config), seed=i, training=False) for i in range(2)]
    played = play(agent.eval(), config, envs, 0, tuple(tasks.observation_space.shape), episodes=3, seed=0,
                  greedy=False, video_dir=None)
    assert played.returns == [5.0, 5.0, 5.0]
    gamma = config.discount
    targets = [sum(gamma ** k for k in range(5 - t)) + gamma ** (5 - t) * c for t in range(5)]
    assert played.value_error["value_mse"] == pytest.approx(np.mean([(c - g) ** 2 for g in targets]), rel=1e-6)
    assert math.isfinite(played.value_error["value_explained_variance"])


@pytest.mark.slow
def test_eval_plays_atari_with_no_op_starts_and_the_sticky_actions_asked_for(tmp_path):
    run_dir = tmp_path / "pong"
    run_cli("train", "--env", "ALE/Pong-v5", "--num-actors", "1", "--envs-per-actor", "2", "--unrolls-per-batch", "2",
            "--max-episode-steps", "30", "--sticky-action-prob", "0", "--total-env-steps", "400", "--out", str(run_dir),
            check=True)
    result = json.loads(run_cli("eval", str(run_dir), "--episodes", "2", "--num-envs", "2", "--sticky-action-prob",
                                "0.25", check=True).stdout.strip().splitlines()[-1])
    assert result["episodes"] == 2 and result["noop_max"] == 30 and result["sticky_action_prob"] == 0.25
    refused = run_cli("eval", str(run_dir), "--sticky-action-prob", "2")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
