"""What ``impactrl eval`` reports and how it plays: the value error (V(x_t) against the discounted
return that followed), episodes cut at a step cap, the rewards fed back to the agent, --video."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import FAST, run_cli
from impactrl.build import env_options, make_agent, rollout_spec, run_tasks
from impactrl.checkpoint import checkpoint_dir, save_checkpoint
from impactrl.config import TrainConfig, with_values
from impactrl.data.rollout import SlotStore
from impactrl.envs import make_env
from impactrl.evaluation import (DEFAULT_EPISODE_STEPS, MonteCarloValues, episode_step_limit, eval_envs,
                                 evaluate_checkpoint, play, training_reward_scale)
from impactrl.runtime.actor import Actor, env_seed
from impactrl.training import build_learner

TESTS = str(Path(__file__).parent)


def saved_checkpoint(run_dir: Path, **settings) -> Path:
    """The checkpoint a run with ``settings`` starts from (a fresh learner's), as a run writes it."""
    learner, _ = build_learner(with_values(TrainConfig(), settings), None)
    checkpoint_dir(run_dir).mkdir(parents=True)
    return save_checkpoint(run_dir, learner.state_dict(), "ckpt_0000000000", keep=1)


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
    assert result["fire_reset"]
    refused = run_cli("eval", str(run_dir), "--sticky-action-prob", "2")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


def test_episodes_that_never_end_are_cut_at_the_cap_and_counted(tmp_path, capsys):
    checkpoint = saved_checkpoint(tmp_path / "endless", env="oddenvs:Endless-v0")
    result = evaluate_checkpoint(checkpoint, episodes=3, num_envs=2, max_episode_steps=50)
    assert result["return_mean"] == 50.0 and result["episodes"] == 3  # a reward of 1 a step, cut at 50
    assert result["episodes_cut"] == 3 and result["max_episode_steps"] == 50
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 3 and all("reached 50 steps without ending: cut there" in note for note in notes), notes
    ended = evaluate_checkpoint(saved_checkpoint(tmp_path / "cartpole", env="CartPole-v1"), episodes=2, num_envs=2)
    assert ended["episodes_cut"] == 0 and ended["max_episode_steps"] == 500  # CartPole-v1's own limit
    assert capsys.readouterr().err == ""


def test_the_step_cap_is_the_envs_own_limit_where_it_has_one():
    config = TrainConfig()
    assert episode_step_limit("CartPole-v1", config) == 500
    assert episode_step_limit("CartPole-v1", with_values(config, {"max_episode_steps": 30})) == 30
    assert episode_step_limit("ALE/Pong-v5", config) == 108_000 // 4  # the v5 games' frames, 4 a step
    assert episode_step_limit("oddenvs:Endless-v0", config) is None and DEFAULT_EPISODE_STEPS == 100_000


@pytest.mark.slow  # trains with real processes, then plays 100,000 steps
def test_eval_of_episodes_that_never_end_finishes_and_says_how_far_it_got(tmp_path):
    run_dir = tmp_path / "endless"
    run_cli("train", "--env", "oddenvs:Endless-v0", *FAST, "--total-env-steps", "2000", "--out", str(run_dir),
            "--quiet", check=True, extra_path=TESTS)
    result = run_cli("eval", str(run_dir), "--episodes", "1", "--num-envs", "1", timeout=280, check=True,
                     extra_path=TESTS)
    assert json.loads(result.stdout.splitlines()[-1])["episodes_cut"] == 1
    lines = result.stderr.splitlines()
    assert lines[-1] == ("impactrl eval: an episode of Endless-v0 reached 100,000 steps without ending: cut there, "
                         "its return so far counted (1 cut so far; --max-episode-steps N sets the cap)")


def test_a_video_dir_that_cannot_be_made_is_refused_before_any_episode(tmp_path):
    checkpoint = saved_checkpoint(tmp_path / "run", env="CartPole-v1")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for video_dir, message in ((a_file / "videos", "cannot write there (Not a directory)"),
                               (a_file, "is a file, not a directory")):
        # As many episodes as would take minutes: the refusal comes first.
        result = run_cli("eval", str(checkpoint), "--episodes", "100000", "--video", str(video_dir), timeout=60)
        assert result.returncode == 2 and result.stderr.splitlines() == [
            f"impactrl eval: error: --video {video_dir}{':' if 'write' in message else ''} {message}"], result.stderr


def test_eval_feeds_the_lstm_the_rewards_training_fed_it():
    """With --normalize-rewards the actor's envs return r/σ and eval's return r; eval divides by the
    σ the checkpoint's normalisers hold. The same seeds and a policy that always pushes left give
    the same transitions, so the agent must see the same previous rewards."""
    config = with_values(TrainConfig(), {"env": "CartPole-v1", "use_lstm": True, "normalize_rewards": True,
                                         "num_actors": 1, "envs_per_actor": 2})
    stats = np.tile([0.0, 4.0, 1e12], (2, 1))  # σ = 2, over so many returns that more do not move it
    actor = Actor(config, actor_id=0, reward_stats=stats)
    agent = actor.agent
    with torch.no_grad():
        agent.policy_head.linear.weight.zero_()
        agent.policy_head.linear.bias.copy_(torch.tensor([50.0, -50.0]))
    seen = []
    agent.register_forward_pre_hook(lambda module, args: seen.append((args[0].prev_reward[0].clone(),
                                                                      args[0].first[0].clone())))
    tasks = run_tasks(config)
    actor.unroll(SlotStore(rollout_spec(config, agent, tasks), 1, shared=False).slot_arrays(0))
    actor.close()
    training, seen[:] = list(seen), []

    learner, _ = build_learner(config, None)
    learner.reward_stats[0] = torch.from_numpy(stats)
    scale = training_reward_scale(learner.state_dict(), config, tasks, 0)
    assert scale == pytest.approx(2.0)
    seed = env_seed(config, 0, 0, 0)
    play(agent, config, eval_envs("CartPole-v1", env_options(config), seed, 2, 500), 0,
         tuple(tasks.observation_space.shape), episodes=12, seed=seed, greedy=False, video_dir=None, reward_scale=scale)
    evaluation = seen[:len(training)]
    assert torch.equal(torch.stack([first for _, first in training]), torch.stack([first for _, first in evaluation]))
    training_rewards = torch.stack([reward for reward, _ in training])
    assert torch.allclose(training_rewards, torch.stack([reward for reward, _ in evaluation]), rtol=1e-6)
    assert training_rewards.unique().tolist() == [0.0, pytest.approx(0.5)]  # 1/σ, and 0 at episode starts


def test_a_long_evaluation_says_how_far_it_got_on_a_pipe(monkeypatch, capsys):
    """Off a terminal a line every PROGRESS_EVERY_S (0 here: a machine may play 100,000 steps before 10 s pass)."""
    from impactrl import evaluation

    monkeypatch.setattr(evaluation, "PROGRESS_EVERY_S", 0.0)
    progress = evaluation.Progress("Endless-v0", episodes=1)
    progress.update(0, 12_345)
    progress.close()
    line = capsys.readouterr().err.strip()
    assert line.startswith("impactrl eval: Endless-v0: 0/1 episodes, 12,345 env steps in "), line
