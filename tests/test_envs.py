"""impactrl.envs on real environments (CartPole, MinAtar, ALE): no mocks."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest

from impactrl.envs import (
    CARTPOLE_NO_VELOCITY_ID,
    EnvOptions,
    EpisodicLife,
    PressFire,
    check_env_id,
    env_family,
    make_env,
    register_all,
)
from impactrl.errors import UserError


def _layers(env: gym.Env) -> list[type]:
    out = []
    while True:
        out.append(type(env))
        if not isinstance(env, gym.Wrapper):
            return out
        env = env.env


def _run_episode(env: gym.Env, max_steps: int):
    """Random actions until terminated/truncated; returns (sum of rewards, steps, last step)."""
    total, steps = 0.0, 0
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += float(reward)
        steps += 1
        if terminated or truncated:
            return total, steps, (obs, reward, terminated, truncated, info)
        assert "episode" not in info
    pytest.fail(f"episode did not end within {max_steps} steps")


# --------------------------------------------------------------------------- classic


def test_cartpole_shapes_and_episode_stats():
    env = make_env("CartPole-v1", seed=0)
    assert env_family("CartPole-v1") == "classic"
    assert isinstance(env, gym.wrappers.RecordEpisodeStatistics)
    obs, info = env.reset(seed=0)
    assert obs.shape == (4,) and obs.dtype == np.float32 and "episode" not in info
    assert env.observation_space.contains(obs)
    assert env.action_space == gym.spaces.Discrete(2)
    total, steps, (_, _, terminated, truncated, info) = _run_episode(env, 600)
    assert info["episode"]["r"] == pytest.approx(total)
    assert info["episode"]["l"] == steps
    # a second episode starts the statistics afresh
    env.reset()
    total2, steps2, (*_, info2) = _run_episode(env, 600)
    assert info2["episode"]["r"] == pytest.approx(total2) and info2["episode"]["l"] == steps2


def test_max_episode_steps_override_truncates_with_stats():
    env = make_env("CartPole-v1", EnvOptions(max_episode_steps=3), seed=1)
    env.reset(seed=1)
    total, steps, (_, _, terminated, truncated, info) = _run_episode(env, 10)
    assert steps == 3 and truncated and not terminated
    assert info["episode"]["l"] == 3 and info["episode"]["r"] == pytest.approx(total)


def test_seed_seeds_the_action_space_only():
    a = make_env("CartPole-v1", seed=123)
    b = make_env("CartPole-v1", seed=123)
    assert [a.action_space.sample() for _ in range(20)] == [b.action_space.sample() for _ in range(20)]
    obs_a, _ = a.reset(seed=5)
    obs_b, _ = b.reset(seed=5)
    np.testing.assert_array_equal(obs_a, obs_b)


def test_cartpole_no_velocity():
    env = make_env(CARTPOLE_NO_VELOCITY_ID, seed=0)
    assert env_family(CARTPOLE_NO_VELOCITY_ID) == "classic"
    assert env.observation_space.shape == (2,)
    spec, cartpole = gym.spec(CARTPOLE_NO_VELOCITY_ID), gym.spec("CartPole-v1")
    assert spec.max_episode_steps == 500 == cartpole.max_episode_steps
    assert spec.reward_threshold == cartpole.reward_threshold
    limits = [w for w in _iter_wrappers(env) if isinstance(w, gym.wrappers.TimeLimit)]
    assert len(limits) == 1 and limits[0]._max_episode_steps == 500
    obs, _ = env.reset(seed=0)
    for _ in range(20):
        state = np.asarray(env.unwrapped.state, dtype=np.float32)
        assert obs.shape == (2,) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, state[[0, 2]])
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()


def _iter_wrappers(env):
    while isinstance(env, gym.Wrapper):
        yield env
        env = env.env


# --------------------------------------------------------------------------- MinAtar


def test_minatar_breakout_channels_first_and_stats():
    env = make_env("MinAtar/Breakout-v1", seed=0)
    assert env_family("MinAtar/Breakout-v1") == "minatar"
    assert env.observation_space == gym.spaces.Box(0, 1, (4, 10, 10), np.uint8)
    assert env.action_space == gym.spaces.Discrete(3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 10, 10) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    assert env.observation_space.contains(obs)
    raw = env.unwrapped.game.state()  # (10, 10, 4) bool
    np.testing.assert_array_equal(obs, np.transpose(raw, (2, 0, 1)).astype(np.uint8))
    total, steps, (obs, _, terminated, _, info) = _run_episode(env, 5000)
    assert terminated and env.observation_space.contains(obs)
    assert info["episode"]["r"] == pytest.approx(total) and info["episode"]["l"] == steps


# --------------------------------------------------------------------------- Atari


def test_pong_frames_skip_sticky_and_eval_mode():
    env = make_env("ALE/Pong-v5", EnvOptions(sticky_action_prob=0.0), seed=0, training=False)
    assert env_family("ALE/Pong-v5") == "atari"
    assert env_family("PongNoFrameskip-v4") == "atari"
    assert EpisodicLife not in _layers(env)
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    ale = env.unwrapped.ale
    assert ale.getFloat("repeat_action_probability") == 0.0
    for _ in range(3):
        before = ale.getEpisodeFrameNumber()
        obs, *_ = env.step(env.action_space.sample())
        assert ale.getEpisodeFrameNumber() == before + 4
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    env.close()

    default = make_env("ALE/Pong-v5")  # training: EpisodicLife outermost, v5 sticky default
    assert isinstance(default, EpisodicLife)
    assert default.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    default.close()
    sticky = make_env("ALE/Pong-v5", EnvOptions(sticky_action_prob=0.5, frame_skip=2, frame_stack=2))
    assert sticky.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.5)
    sticky.reset(seed=0)
    before = sticky.unwrapped.ale.getEpisodeFrameNumber()
    obs, *_ = sticky.step(0)
    assert obs.shape == (2, 84, 84) and sticky.unwrapped.ale.getEpisodeFrameNumber() == before + 2
    sticky.close()

    # max_episode_steps counts agent steps (ALE frame limit = steps * frame_skip, no-ops included)
    short = make_env("ALE/Pong-v5", EnvOptions(max_episode_steps=5, noop_max=0, fire_reset=False), seed=0)
    short.reset(seed=0)
    total, steps, (_, _, terminated, truncated, info) = _run_episode(short, 10)
    assert steps == 5 and truncated and not terminated
    assert info["episode"]["l"] == 5 * 4 and info["episode"]["r"] == pytest.approx(total)
    short.close()


def test_breakout_episodic_life():
    env = make_env("ALE/Breakout-v5", seed=0)
    env.reset(seed=0)
    ale = env.unwrapped.ale
    lives = ale.lives()
    assert lives == 5
    game_return, life_losses = 0.0, 0
    for _ in range(4000):  # a random Breakout game is a few hundred agent steps
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        game_return += float(reward)
        if not (terminated or truncated):
            assert "episode" not in info
            continue
        assert not truncated
        if "episode" in info:  # game over: the full-game return
            assert info["episode"]["r"] == pytest.approx(game_return)
            assert life_losses == lives - 1 and ale.lives() == 0
            break
        # a life loss: training episode over, game goes on
        life_losses += 1
        assert ale.lives() == lives - life_losses
        frame = ale.getEpisodeFrameNumber()
        obs, reset_info = env.reset()
        assert "episode" not in reset_info
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert ale.lives() == lives - life_losses  # not reset
        assert ale.getEpisodeFrameNumber() == frame + 4  # one no-op agent step, no game reset
    else:
        pytest.fail("Breakout game did not end within 4000 agent steps")
    # after game over, reset really resets the game
    env.reset()
    assert ale.lives() == lives and ale.getEpisodeFrameNumber() <= 4 * 30
    env.close()


@pytest.mark.parametrize("training", [True, False])
def test_breakout_plays_on_without_the_agent_pressing_fire(training: bool):
    """An agent that only ever plays NOOP loses all 5 lives (FIRE serves each ball, in training and
    evaluation); without fire_reset the first ball is never served. Pong has FIRE too."""
    def noop_game_steps(options: EnvOptions) -> int | None:
        env = make_env("ALE/Breakout-v5", options, seed=0, training=training)
        env.reset(seed=0)
        for step in range(1, 3000):
            *_, terminated, truncated, info = env.step(0)
            if "episode" in info:
                return step
            if terminated or truncated:
                env.reset()
        return None

    steps = noop_game_steps(EnvOptions(sticky_action_prob=0.0))
    assert steps is not None and steps < 1000
    assert noop_game_steps(EnvOptions(sticky_action_prob=0.0, fire_reset=False)) is None
    assert PressFire in _layers(make_env("ALE/Pong-v5", training=training))
    assert PressFire not in _layers(make_env("ALE/MsPacman-v5", training=training))  # action 1 is UP


# --------------------------------------------------------------------------- ids and options


def test_register_all_is_idempotent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_all()
        register_all()
    for env_id in ("ALE/Pong-v5", "MinAtar/Breakout-v1", CARTPOLE_NO_VELOCITY_ID):
        assert env_id in gym.registry


def test_minatar_ids_are_minatars_own_and_checking_another_id_does_not_import_minatar():
    register_all()
    ours = {env_id: gym.registry.pop(env_id) for env_id in list(gym.registry) if env_id.startswith("MinAtar/")}
    try:
        from minatar.gym import register_envs

        register_envs()
        theirs = {env_id: spec for env_id, spec in gym.registry.items() if env_id.startswith("MinAtar/")}
    finally:
        gym.registry.update(ours)
    assert {k: (s.entry_point, s.kwargs) for k, s in ours.items()} == \
           {k: (s.entry_point, s.kwargs) for k, s in theirs.items()}
    # Importing minatar imports matplotlib and seaborn: seconds of every run's start.
    script = ("import sys; from impactrl.envs import check_env_id, env_family; check_env_id('CartPole-v1'); "
              "assert env_family('MinAtar/Breakout-v1') == 'minatar'; "
              "print(sorted(m for m in ('minatar', 'seaborn', 'matplotlib') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("env_id", ["CartPole-v1", "ALE/Breakout-v5", "MinAtar/SpaceInvaders-v1",
                                    CARTPOLE_NO_VELOCITY_ID, "Hopper-v5"])
def test_check_env_id_known(env_id):
    check_env_id(env_id)


@pytest.mark.parametrize(
    "env_id, suggestion",
    [("CartPol-v1", "CartPole-v1"), ("cartpole-v1", "CartPole-v1"), ("ALE/Pongg-v5", "ALE/Pong-v5"),
     ("MinAtar/Breakout", "MinAtar/Breakout-v"), ("Pong-v5", "ALE/Pong-v5"), ("Breakout-v1", "MinAtar/Breakout-v1"),
     ("MinAtar/Pong-v1", "ALE/Pong-v5"), ("ALE/Asterix-v1", "ALE/Asterix-v5"), ("MinAtar/Hopper-v5", "Hopper-v5")],
)
def test_check_env_id_unknown_suggests(env_id, suggestion):
    with pytest.raises(UserError) as err:
        check_env_id(env_id)
    message = str(err.value)
    assert "unknown environment id" in message and f"did you mean '{suggestion}" in message
    assert "\n" not in message
    with pytest.raises(UserError, match="unknown environment id"):
        make_env(env_id)


def test_check_env_id_suggests_nothing_far_off():
    with pytest.raises(UserError, match="unknown environment id 'Foo-v1'; no registered id is close"):
        check_env_id("Foo-v1")


@pytest.mark.parametrize("env_id", ["", "   ", "foo bar baz qux", None, "nosuchmodule_xyz:Foo-v0"])
def test_check_env_id_malformed(env_id):
    with pytest.raises(UserError) as err:
        check_env_id(env_id)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "options, name",
    [(EnvOptions(frame_skip=0), "frame_skip"), (EnvOptions(frame_stack=0), "frame_stack"),
     (EnvOptions(noop_max=-1), "noop_max"), (EnvOptions(screen_size=4), "screen_size"),
     (EnvOptions(sticky_action_prob=1.5), "sticky_action_prob"),
     (EnvOptions(sticky_action_prob=float("nan")), "sticky_action_prob"),
     (EnvOptions(max_episode_steps=0), "max_episode_steps"), (EnvOptions(frame_skip=2.5), "frame_skip")],
)
def test_bad_options(options, name):
    problems = options.problems()
    assert len(problems) == 1 and name in problems[0]
    with pytest.raises(UserError, match=name):
        make_env("CartPole-v1", options)


def test_options_problems_collects_all():
    assert EnvOptions().problems() == []
    assert EnvOptions(sticky_action_prob=0.0, max_episode_steps=1, noop_max=0).problems() == []
    problems = EnvOptions(frame_skip=0, frame_stack=0, sticky_action_prob=-0.1).problems()
    assert len(problems) == 3
    assert "frame_skip must be ≥ 1, got 0" in problems


@pytest.mark.skipif(importlib.util.find_spec("Box2D") is not None, reason="Box2D is installed")
def test_missing_dependency_is_a_user_error():
    with pytest.raises(UserError) as err:
        make_env("LunarLander-v3")
    message = str(err.value)
    assert "LunarLander-v3" in message and "Box2D" in message and "\n" not in message
