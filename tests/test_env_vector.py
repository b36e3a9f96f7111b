"""The actor's env vectors (impactrl.envs.vector) on both backends, with real envs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from impactrl.envs import EnvOptions, make_env_vector
from impactrl.envs.vector import envpool_task
from impactrl.errors import UserError

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_envpool = pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool is not installed")
BACKENDS = ["gymnasium", pytest.param("envpool", marks=needs_envpool)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ended_episodes_restart_in_the_same_step(backend: str):
    """A time limit of 5: every 5th step is truncated, with the final observation kept, the episode
    recorded, and the next episode already begun in the returned observations."""
    envs = make_env_vector("CartPole-v1", EnvOptions(max_episode_steps=5), 2, seed=3, backend=backend)
    obs = envs.reset()
    assert obs.shape == (2, 4) and obs.dtype == np.float32
    for _ in range(2):
        for t in range(5):
            previous = obs.copy()
            step = envs.step(np.array([0, 1]))
            obs = step.obs
            if t < 4:
                assert not step.truncated.any() and not step.terminated.any() and not step.final_obs
                assert np.isnan(step.episode_return).all() and (step.episode_length == 0).all()
        assert step.truncated.all() and not step.terminated.any()
        assert sorted(step.final_obs) == [0, 1]
        np.testing.assert_array_equal(step.episode_return, [5.0, 5.0])
        np.testing.assert_array_equal(step.episode_length, [5, 5])
        for e in range(2):
            # the pole moved in the last step of the old episode; the new one starts near upright
            assert not np.allclose(step.final_obs[e], previous[e])
            assert np.abs(obs[e]).max() <= 0.05
    envs.close()


@needs_envpool
def test_backends_give_the_same_atari_frames():
    """With one reset no-op and no sticky actions both backends are deterministic: the same
    pixels, rewards and episode ends through resets and lost lives (FIRE after each, and a no-op
    step after a lost life) and game over."""
    options = EnvOptions(noop_max=1, sticky_action_prob=0.0)
    gym_envs = make_env_vector("ALE/Breakout-v5", options, 1, seed=3, backend="gymnasium")
    pool = make_env_vector("ALE/Breakout-v5", options, 1, seed=3, backend="envpool")
    assert gym_envs.observation_space == pool.observation_space
    assert gym_envs.action_space == pool.action_space
    np.testing.assert_array_equal(gym_envs.reset(), pool.reset())
    rng = np.random.default_rng(0)
    lives_lost = games = 0
    for _ in range(1500):
        action = rng.integers(0, 4, size=1)
        a, b = gym_envs.step(action), pool.step(action)
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.reward, b.reward)
        np.testing.assert_array_equal(a.terminated, b.terminated)
        np.testing.assert_array_equal(a.episode_return, b.episode_return)
        lives_lost += int(a.terminated[0] and np.isnan(a.episode_return[0]))
        games += int(not np.isnan(a.episode_return[0]))
    assert lives_lost >= 4 and games >= 1
    gym_envs.close()
    pool.close()


@needs_envpool
def test_envpool_episodic_life_keeps_whole_game_returns():
    """Breakout (5 lives): 4 lost lives end training episodes with no record; game over records
    the return of all 5 lives, the unclipped sum of the rewards, and a fresh game starts."""
    envs = make_env_vector("ALE/Breakout-v5", EnvOptions(), 1, seed=0, backend="envpool")
    envs.reset()
    rng = np.random.default_rng(0)
    rewards, life_losses = 0.0, 0
    for _ in range(4000):
        step = envs.step(rng.integers(0, 4, size=1))
        rewards += float(step.reward[0])
        if not step.terminated[0]:
            assert np.isnan(step.episode_return[0])
            continue
        if np.isnan(step.episode_return[0]):
            life_losses += 1
            continue
        assert life_losses == 4
        assert step.episode_return[0] == pytest.approx(rewards)
        assert step.episode_length[0] > 0 and step.episode_length[0] % 4 == 0  # agent frames
        break
    else:
        pytest.fail("a random Breakout game did not end within 4000 agent steps")
    envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_breakout_serves_every_ball_for_an_agent_that_never_fires(backend: str):
    """fire_reset: a NOOP-only agent loses its 5 lives (4 training episodes end without a record)
    and the game ends; without it the first ball is never served."""
    def noop_game(options: EnvOptions) -> tuple[int, int] | None:
        envs = make_env_vector("ALE/Breakout-v5", options, 1, seed=0, backend=backend)
        envs.reset()
        lives_lost = 0
        for step in range(1, 3000):
            result = envs.step(np.zeros(1, np.int64))
            if not np.isnan(result.episode_return[0]):
                envs.close()
                return step, lives_lost
            lives_lost += int(result.terminated[0])
        envs.close()
        return None

    steps, lives_lost = noop_game(EnvOptions(sticky_action_prob=0.0))
    assert steps < 1000 and lives_lost == 4
    assert noop_game(EnvOptions(sticky_action_prob=0.0, fire_reset=False)) is None


@needs_envpool
@pytest.mark.parametrize("env_id, options, message", [
    ("MinAtar/Breakout-v1", EnvOptions(), "use --env-backend gymnasium"),
    ("impactrl/CartPoleNoVelocity-v1", EnvOptions(), "use --env-backend gymnasium"),
    ("CartPole-v1", EnvOptions(normalize_reward_gamma=0.99), "does not scale rewards"),
    ("ALE/Pong-v5", EnvOptions(noop_max=0), "noop_max >= 1"),
])
def test_envpool_refuses_what_it_cannot_run(env_id: str, options: EnvOptions, message: str):
    with pytest.raises(UserError, match=message):
        envpool_task(env_id, options)


@needs_envpool
def test_envpool_maps_ale_ids_and_their_defaults():
    task, kwargs = envpool_task("ALE/Pong-v5", EnvOptions())
    assert task == "Pong-v5" and kwargs["repeat_action_probability"] == 0.25
    assert kwargs["max_episode_steps"] == 27_000 and not kwargs["episodic_life"] and not kwargs["reward_clip"]
    assert not kwargs["use_fire_reset"]  # EnvPoolEnvs presses FIRE itself, as PressFire does
    task, kwargs = envpool_task("PongNoFrameskip-v4", EnvOptions(frame_skip=2))
    assert task == "Pong-v5" and kwargs["repeat_action_probability"] == 0.0
    assert kwargs["max_episode_steps"] == 54_000 and kwargs["frame_skip"] == 2


@needs_envpool
def test_cli_rejects_an_env_envpool_lacks(run_dir: Path):
    result = run_cli("train", "--env", "MinAtar/Breakout-v1", "--env-backend", "envpool", "--out", str(run_dir))
    assert result.returncode == 2 and "use --env-backend gymnasium" in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1
    assert not run_dir.exists()


@needs_envpool
@pytest.mark.slow
def test_impact_learns_cartpole_on_envpool(run_dir: Path):
    """The preset reaches 450 on EnvPool too, with a budget twice the gymnasium test's: EnvPool's
    batched steps raise the policy lag, and with it the env steps IMPACT needs."""
    from test_learning import best_return

    assert best_return(run_dir, 450, "--algo", "impact", "--env", "CartPole-v1", "--env-backend", "envpool",
                       "--num-actors", "2", "--total-env-steps", "1000000") >= 450
