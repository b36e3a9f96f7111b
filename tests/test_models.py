"""Tests for impactrl.models: torsos, heads, the (recurrent) agent and build_agent."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from impactrl.errors import UserError
from impactrl.models import (
    Agent,
    AgentInput,
    CategoricalHead,
    MinAtarTorso,
    MLPTorso,
    PolicyHead,
    ResNetTorso,
    ShallowCNNTorso,
    ValueHead,
    build_agent,
    supported_torsos,
)

# ------------------------------------------------------------------------------------ torsos


def test_resnet_torso_shapes_84x84():
    torch.manual_seed(0)
    torso = ResNetTorso(4, 84, 84)
    assert torso.flat_size == 32 * 11 * 11 == 3872
    assert torso.fc.in_features == 3872
    obs = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    out = torso(obs)
    assert out.shape == (2, 256) and torso.output_size == 256
    assert out.dtype == torch.float32 and (out >= 0).all()
    # 15 conv layers: 3 sections x (1 + 2 blocks x 2 convs).
    assert sum(isinstance(m, torch.nn.Conv2d) for m in torso.modules()) == 15


def test_shallow_cnn_torso_shapes():
    torso = ShallowCNNTorso(4, 84, 84)
    assert torso.fc.in_features == 32 * 9 * 9
    out = torso(torch.zeros(3, 4, 84, 84, dtype=torch.uint8))
    assert out.shape == (3, 256) and torso.output_size == 256


def test_minatar_torso_shapes_and_bool_input():
    torso = MinAtarTorso(4, 10, 10)
    assert torso.fc.in_features == 16 * 8 * 8
    obs = torch.rand(5, 4, 10, 10) > 0.5
    out = torso(obs)
    assert out.shape == (5, 128) and torso.output_size == 128
    # bool / uint8 {0,1} planes are only cast, not divided by 255.
    torch.testing.assert_close(torso(obs.to(torch.uint8)), out)
    torch.testing.assert_close(torso(obs.float()), out)


def test_mlp_torso_flattens():
    torso = MLPTorso(12, hidden_sizes=(32, 16))
    out = torso(torch.randn(7, 3, 4))
    assert out.shape == (7, 16) and torso.output_size == 16
    assert (out.abs() <= 1).all()  # tanh
    assert MLPTorso(5, hidden_sizes=()).output_size == 5


def test_uint8_frames_are_scaled_by_255():
    torch.manual_seed(0)
    for torso in (ShallowCNNTorso(1, 32, 32), ResNetTorso(1, 32, 32)):
        frames = torch.randint(0, 256, (2, 1, 32, 32), dtype=torch.uint8)
        torch.testing.assert_close(torso(frames), torso(frames.float() / 255.0))


def test_torso_cast_follows_parameter_dtype():
    torso = MinAtarTorso(2, 5, 5).double()
    assert torso(torch.zeros(1, 2, 5, 5, dtype=torch.bool)).dtype == torch.float64


def test_too_small_image_is_a_user_error():
    with pytest.raises(UserError, match="channels-first"):
        ShallowCNNTorso(84, 84, 4)


# ------------------------------------------------------------------------------------- heads


def _logits(shape=(6, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * 2


def test_categorical_head_init_and_attributes():
    head = CategoricalHead(8, 5)
    assert isinstance(head, PolicyHead)
    assert head.action_shape == () and head.action_dtype == torch.int64
    assert head.params_shape == (5,) and head.action_encoding_size == 5
    assert torch.count_nonzero(head.linear.bias) == 0
    assert head.linear.weight.abs().max() < 0.05  # orthogonal, gain 0.01
    assert head(torch.randn(3, 4, 8)).shape == (3, 4, 5)


def test_categorical_maths_matches_torch_distributions():
    head = CategoricalHead(1, 5)
    p_logits, q_logits = _logits(seed=0), _logits(seed=1)
    p, q = Categorical(logits=p_logits), Categorical(logits=q_logits)
    actions = torch.tensor([0, 4, 2, 1, 3, 2])
    torch.testing.assert_close(head.log_prob(p_logits, actions), p.log_prob(actions))
    torch.testing.assert_close(head.entropy(p_logits), p.entropy())
    torch.testing.assert_close(head.kl(p_logits, q_logits), kl_divergence(p, q))
    torch.testing.assert_close(head.kl(p_logits, p_logits), torch.zeros(6, dtype=torch.float64))
    assert torch.equal(head.mode(p_logits), p_logits.argmax(-1))
    # Arbitrary leading dims.
    logits3 = _logits((2, 3, 5), seed=2)
    acts3 = head.sample(logits3)
    assert acts3.shape == (2, 3) and acts3.dtype == torch.int64
    torch.testing.assert_close(head.log_prob(logits3, acts3), Categorical(logits=logits3).log_prob(acts3))


def test_categorical_masked_logits_are_finite():
    head = CategoricalHead(1, 3)
    logits = torch.tensor([[0.0, -float("inf"), 1.0]])
    assert torch.isfinite(head.entropy(logits)).all()
    assert torch.isfinite(head.kl(logits, torch.zeros(1, 3))).all()


def test_categorical_sampling_frequencies():
    head = CategoricalHead(1, 4)
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().expand(20_000, 4)
    g = torch.Generator().manual_seed(123)
    samples = head.sample(logits, generator=g)
    freqs = torch.bincount(samples, minlength=4).float() / samples.numel()
    torch.testing.assert_close(freqs, probs, atol=0.015, rtol=0)
    # Same generator seed -> same samples.
    again = head.sample(logits, generator=torch.Generator().manual_seed(123))
    assert torch.equal(samples, again)


def test_categorical_encode_action_is_one_hot():
    head = CategoricalHead(1, 3)
    enc = head.encode_action(torch.tensor([[0, 2], [1, 1]]))
    assert enc.shape == (2, 2, 3) and enc.dtype == torch.float32
    assert torch.equal(enc.argmax(-1), torch.tensor([[0, 2], [1, 1]]))
    assert torch.equal(enc.sum(-1), torch.ones(2, 2))


def test_value_head():
    head = ValueHead(8)
    assert head(torch.randn(3, 4, 8)).shape == (3, 4)
    assert torch.count_nonzero(head.linear.bias) == 0
    assert ValueHead(8, num_outputs=3)(torch.randn(3, 4, 8)).shape == (3, 4, 3)


# ------------------------------------------------------------------------------------- agent

OBS_SHAPE = (3, 6, 6)
NUM_ACTIONS = 4


def _agent(use_lstm: bool, seed: int = 0) -> Agent:
    torch.manual_seed(seed)
    agent = Agent(
        MinAtarTorso(*OBS_SHAPE),
        lambda n: CategoricalHead(n, NUM_ACTIONS),
        use_lstm=use_lstm,
        lstm_size=32,
    ).double()
    # Bigger head weights so that differences in the core are visible in the logits.
    torch.nn.init.normal_(agent.policy_head.linear.weight)
    return agent


def _inputs(T: int, B: int, seed: int = 0, first_at: dict[int, list[int]] | None = None) -> AgentInput:
    g = torch.Generator().manual_seed(seed)
    first = torch.zeros(T, B, dtype=torch.bool)
    first[0] = True
    for t, bs in (first_at or {}).items():
        first[t, bs] = True
    prev_action = torch.randint(0, NUM_ACTIONS, (T, B), generator=g)
    prev_reward = torch.randn(T, B, generator=g, dtype=torch.float64) * 3
    prev_action[first] = 0
    prev_reward[first] = 0
    return AgentInput(
        obs=torch.rand(T, B, *OBS_SHAPE, generator=g) > 0.5,
        prev_action=prev_action,
        prev_reward=prev_reward,
        first=first,
    )


def _slice(inputs: AgentInput, t0: int, t1: int) -> AgentInput:
    return AgentInput(*(x[t0:t1] for x in inputs))


def test_agent_without_lstm_shapes_and_stepwise_equivalence():
    agent = _agent(use_lstm=False)
    T, B = 5, 3
    inputs = _inputs(T, B)
    assert agent.initial_state(B) == ()
    out, state = agent(inputs, ())
    assert state == ()
    assert out.policy.shape == (T, B, NUM_ACTIONS) and out.value.shape == (T, B)
    steps = [agent(_slice(inputs, t, t + 1), ())[0] for t in range(T)]
    torch.testing.assert_close(torch.cat([s.policy for s in steps]), out.policy)
    torch.testing.assert_close(torch.cat([s.value for s in steps]), out.value)


def test_agent_with_lstm_unroll_equals_stepwise():
    agent = _agent(use_lstm=True)
    T, B = 6, 3
    inputs = _inputs(T, B, first_at={3: [1]})
    state0 = agent.initial_state(B)
    assert len(state0) == 2 and all(s.shape == (B, 32) and not s.any() for s in state0)
    out, final = agent(inputs, state0)
    assert out.policy.shape == (T, B, NUM_ACTIONS) and out.value.shape == (T, B)

    # Actors: one step at a time, carrying the state.
    state = state0
    policies, values = [], []
    for t in range(T):
        step_out, state = agent(_slice(inputs, t, t + 1), state)
        policies.append(step_out.policy)
        values.append(step_out.value)
    torch.testing.assert_close(torch.cat(policies), out.policy)
    torch.testing.assert_close(torch.cat(values), out.value)
    for a, b in zip(state, final):
        torch.testing.assert_close(a, b)

    # Two half-unrolls carrying the state also match (learner unroll boundaries).
    out_a, mid = agent(_slice(inputs, 0, 2), state0)
    out_b, end = agent(_slice(inputs, 2, T), mid)
    torch.testing.assert_close(torch.cat([out_a.policy, out_b.policy]), out.policy)
    for a, b in zip(end, final):
        torch.testing.assert_close(a, b)


def test_agent_lstm_first_flag_resets_state():
    agent = _agent(use_lstm=True)
    T, B, t_reset = 7, 3, 4
    inputs = _inputs(T, B, first_at={t_reset: [0, 2]})
    # Start from a non-zero state: first[0] must also reset it.
    g = torch.Generator().manual_seed(7)
    random_state = tuple(torch.randn(B, 32, generator=g, dtype=torch.float64) for _ in range(2))
    out, _ = agent(inputs, random_state)
    out_zero, _ = agent(inputs, agent.initial_state(B))
    torch.testing.assert_close(out.policy, out_zero.policy)

    # After the reset, entries 0 and 2 equal a fresh run started at t_reset with the initial state.
    fresh, _ = agent(_slice(inputs, t_reset, T), agent.initial_state(B))
    torch.testing.assert_close(out.policy[t_reset:, [0, 2]], fresh.policy[:, [0, 2]])
    torch.testing.assert_close(out.value[t_reset:, [0, 2]], fresh.value[:, [0, 2]])
    # Entry 1 was not reset: it carries memory, so it differs from the fresh run.
    assert not torch.allclose(out.policy[t_reset:, 1], fresh.policy[:, 1])

    # Without the reset flag, entry 0 would differ too.
    no_reset = inputs._replace(first=inputs.first.clone())
    no_reset.first[t_reset] = False
    out_nr, _ = agent(no_reset, agent.initial_state(B))
    assert not torch.allclose(out_nr.policy[t_reset:, 0], fresh.policy[:, 0])


def test_agent_lstm_uses_clipped_reward_and_prev_action():
    agent = _agent(use_lstm=True)
    inputs = _inputs(2, 2)
    state = agent.initial_state(2)
    base, _ = agent(inputs, state)
    big = inputs._replace(prev_reward=inputs.prev_reward.sign() * 100.0)
    unit = inputs._replace(prev_reward=inputs.prev_reward.sign())
    torch.testing.assert_close(agent(big, state)[0].policy, agent(unit, state)[0].policy)
    other_action = inputs._replace(prev_action=(inputs.prev_action + 1) % NUM_ACTIONS)
    assert not torch.allclose(agent(other_action, state)[0].policy[1], base.policy[1])


@pytest.mark.parametrize("use_lstm", [False, True])
def test_agent_gradients_reach_torso_core_and_heads(use_lstm):
    agent = _agent(use_lstm=use_lstm)
    inputs = _inputs(4, 2, first_at={2: [0]})
    out, _ = agent(inputs, agent.initial_state(2))
    actions = torch.zeros(4, 2, dtype=torch.int64)
    loss = -agent.policy_head.log_prob(out.policy, actions).mean() + out.value.pow(2).mean()
    loss.backward()
    for name, p in agent.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert (agent.core is not None) == use_lstm


# ------------------------------------------------------------------------------- build_agent


def test_build_agent_auto_torsos():
    box = lambda shape, dtype=np.float32, high=1.0: gym.spaces.Box(0, high, shape, dtype)  # noqa: E731
    assert supported_torsos() == ("mlp", "minatar", "shallow_cnn", "resnet")
    assert isinstance(build_agent(box((4,)), gym.spaces.Discrete(2)).torso, MLPTorso)
    minatar = build_agent(box((4, 10, 10), bool), gym.spaces.Discrete(6))
    assert isinstance(minatar.torso, MinAtarTorso) and minatar.torso.uint8_scale == 1.0
    atari = build_agent(box((4, 84, 84), np.uint8, 255), gym.spaces.Discrete(6), use_lstm=True, lstm_size=64)
    assert isinstance(atari.torso, ShallowCNNTorso) and atari.torso.uint8_scale == pytest.approx(1 / 255)
    assert atari.core.hidden_size == 64 and atari.core.input_size == 256 + 1 + 6
    resnet = build_agent(box((4, 84, 84), np.uint8, 255), gym.spaces.Discrete(6), torso="resnet")
    assert isinstance(resnet.torso, ResNetTorso)
    flat = build_agent(box((4, 10, 10), bool), gym.spaces.Discrete(6), torso="mlp", hidden_sizes=(8,))
    assert flat.torso.input_size == 400 and flat.torso.output_size == 8
    out, _ = minatar(AgentInput(torch.zeros(2, 3, 4, 10, 10, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.int64),
                                torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)), ())
    assert out.policy.shape == (2, 3, 6) and out.value.shape == (2, 3)


@pytest.mark.parametrize(
    "action_space, needle",
    [
        (gym.spaces.Box(-1.0, 1.0, (3,), np.float32), "Box(-1.0, 1.0, (3,), float32)"),
        (gym.spaces.MultiDiscrete([3, 4]), "MultiDiscrete([3 4])"),
        (gym.spaces.Box(np.zeros(40, np.float32), np.arange(1, 41, dtype=np.float32)), "Box("),
    ],
)
def test_build_agent_rejects_non_discrete_actions(action_space, needle):
    obs = gym.spaces.Box(-1, 1, (4,), np.float32)
    with pytest.raises(UserError) as info:
        build_agent(obs, action_space)
    msg = str(info.value)
    assert "\n" not in msg and needle in msg and "Discrete" in msg
    if isinstance(action_space, gym.spaces.Box):
        assert "Gaussian head" in msg


@pytest.mark.parametrize("torso", ["shallow_cnn", "minatar", "resnet"])
def test_build_agent_rejects_cnn_on_vector_observations(torso):
    obs = gym.spaces.Box(-1, 1, (8,), np.float32)
    with pytest.raises(UserError) as info:
        build_agent(obs, gym.spaces.Discrete(2), torso=torso)
    msg = str(info.value)
    assert "\n" not in msg and "Box(-1.0, 1.0, (8,), float32)" in msg and torso in msg


def test_build_agent_other_user_errors():
    obs = gym.spaces.Box(-1, 1, (8,), np.float32)
    with pytest.raises(UserError, match="unknown torso"):
        build_agent(obs, gym.spaces.Discrete(2), torso="transformer")
    with pytest.raises(UserError, match="Discrete"):
        build_agent(gym.spaces.Discrete(3), gym.spaces.Discrete(2))
    with pytest.raises(UserError, match="start at 0"):
        build_agent(obs, gym.spaces.Discrete(2, start=1))
    with pytest.raises(UserError, match="torso='mlp'"):
        build_agent(gym.spaces.Box(0, 1, (5, 5), np.float32), gym.spaces.Discrete(2))
    with pytest.raises(UserError, match="lstm_size"):
        build_agent(obs, gym.spaces.Discrete(2), use_lstm=True, lstm_size=0)
