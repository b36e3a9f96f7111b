"""Tests for impactrl.models: torsos, heads, the (recurrent) agent and build_agent."""

from __future__ import annotations

import typing

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import (
    AffineTransform,
    Categorical,
    Independent,
    Normal,
    TanhTransform,
    TransformedDistribution,
    kl_divergence,
)

from impactrl.config.settings import ModelSettings
from impactrl.errors import UserError
from impactrl.models import (
    Agent,
    AgentInput,
    CategoricalHead,
    GaussianHead,
    MinAtarTorso,
    MLPTorso,
    NatureCNNTorso,
    PolicyHead,
    ResNetTorso,
    RunningNorm,
    ShallowCNNTorso,
    ValueHead,
    build_agent,
    supported_torsos,
)
from impactrl.models.torsos import learner_channels_last

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


@pytest.mark.parametrize("torso_class, flat, size", [(ShallowCNNTorso, 32 * 9 * 9, 256), (NatureCNNTorso, 64 * 7 * 7, 512)])
def test_plain_cnn_torso_shapes(torso_class, flat, size):
    torso = torso_class(4, 84, 84)
    assert torso.fc.in_features == flat
    out = torso(torch.zeros(3, 4, 84, 84, dtype=torch.uint8))
    assert out.shape == (3, size) and torso.output_size == size


@pytest.mark.parametrize("torso_class, layer_count", [(ShallowCNNTorso, 3), (NatureCNNTorso, 4)])
def test_plain_cnn_layers_start_orthogonal_with_zero_bias(torso_class, layer_count):
    torso = torso_class(4, 84, 84)
    layers = [m for m in torso.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert len(layers) == layer_count
    for layer in layers:
        w = layer.weight.detach().double().flatten(1)  # rows: output units, fewer than inputs (16x256, ...)
        torch.testing.assert_close(w @ w.T, 2.0 * torch.eye(w.shape[0], dtype=torch.float64), atol=1e-4, rtol=0)
        assert not layer.bias.any()


def test_dead_units_are_counted_per_relu_layer_of_the_main_path():
    torch.manual_seed(0)
    torso = ShallowCNNTorso(4, 84, 84)
    frames = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        torso.convs[0].bias[:4] = -1e3  # 4 of 16 channels negative on every input: dead
        first = torch.relu(torso.convs[0](torso._cast(frames)))  # the torso's own 1/255 scaling
    expected_first = float((first.amax(dim=(0, 2, 3)) <= 0).float().mean())
    fractions = torso.dead_unit_fractions(frames)
    assert len(fractions) == 3 and fractions[0] == expected_first >= 0.25
    with torch.no_grad():
        torso.convs[0].bias[:] = -1e3
    assert torso.dead_unit_fractions(frames)[0] == 1.0
    features = torso(frames)
    torch.testing.assert_close(features, features[:1].expand_as(features))  # blind: one output for every frame
    assert len(MinAtarTorso(4, 10, 10).dead_unit_fractions(torch.zeros(2, 4, 10, 10))) == 2
    assert len(NatureCNNTorso(4, 84, 84).dead_unit_fractions(frames)) == 4
    assert len(ResNetTorso(4, 84, 84).dead_unit_fractions(frames)) == 2  # residual branches not counted
    assert MLPTorso(4).dead_unit_fractions(torch.zeros(2, 4)) == []  # tanh: no ReLU layers
    assert not torso._forward_hooks and all(not m._forward_hooks for m in torso.modules())


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


@pytest.mark.parametrize("torso_class, size", [(ShallowCNNTorso, 84), (NatureCNNTorso, 84), (ResNetTorso, 36)])
def test_a_channels_last_learner_torso_computes_what_a_contiguous_one_does(torso_class, size):
    torch.manual_seed(0)

    def make_torso():
        return torso_class(4, size, size)

    torso, learner_copy = make_torso(), make_torso()
    learner_copy.load_state_dict(torso.state_dict())
    learner_channels_last(learner_copy)
    conv = next(m for m in learner_copy.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    frames = torch.randint(0, 256, (5, 4, size, size), dtype=torch.uint8)
    torso(frames).square().sum().backward()
    learner_copy(frames).square().sum().backward()
    torch.testing.assert_close(learner_copy(frames), torso(frames))
    for mine, theirs in zip(learner_copy.parameters(), torso.parameters()):
        # The two layouts sum in different orders: float32 rounding scales with the largest terms.
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5 * float(theirs.grad.abs().max()))
    # What the learner publishes loads into an actor's contiguous copy unchanged.
    actor = make_torso()
    actor.load_state_dict(learner_copy.state_dict())
    assert all(p.is_contiguous() for p in actor.parameters())
    torch.testing.assert_close(actor(frames), torso(frames))


def test_minatar_torso_stays_contiguous_in_the_learner():
    torso = MinAtarTorso(4, 10, 10)
    learner_channels_last(torso)
    assert not torso.channels_last and torso.conv.weight.is_contiguous()


def test_too_small_image_is_a_user_error():
    with pytest.raises(UserError, match="channels-first"):
        ShallowCNNTorso(84, 84, 4)
    with pytest.raises(UserError, match="nature_cnn torso needs .* at least 36x36"):
        NatureCNNTorso(4, 35, 84)
    NatureCNNTorso(4, 36, 36)


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


def test_categorical_sample_with_log_prob_agrees_and_never_picks_masked_actions():
    head = CategoricalHead(1, 3)
    logits = torch.tensor([[0.5, -float("inf"), -0.5]]).expand(5_000, 3)
    actions, log_prob = head.sample_with_log_prob(logits, generator=torch.Generator().manual_seed(0))
    assert not (actions == 1).any()
    torch.testing.assert_close(log_prob, Categorical(logits=logits).log_prob(actions))


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
    return AgentInput(*(x[t0:t1] if x is not None else None for x in inputs))


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
    assert ("auto", *supported_torsos()) == typing.get_args(typing.get_type_hints(ModelSettings)["torso"])  # --torso's choices
    assert isinstance(build_agent(box((4,)), gym.spaces.Discrete(2)).torso, MLPTorso)
    minatar = build_agent(box((4, 10, 10), bool), gym.spaces.Discrete(6))
    assert isinstance(minatar.torso, MinAtarTorso) and minatar.torso.uint8_scale == 1.0
    atari = build_agent(box((4, 84, 84), np.uint8, 255), gym.spaces.Discrete(6), use_lstm=True, lstm_size=64)
    assert isinstance(atari.torso, ShallowCNNTorso) and atari.torso.uint8_scale == pytest.approx(1 / 255)
    assert atari.core.hidden_size == 64 and atari.core.input_size == 256 + 1 + 6
    resnet = build_agent(box((4, 84, 84), np.uint8, 255), gym.spaces.Discrete(6), torso="resnet")
    assert isinstance(resnet.torso, ResNetTorso)
    nature = build_agent(box((4, 84, 84), np.uint8, 255), gym.spaces.Discrete(6), torso="nature_cnn")
    assert isinstance(nature.torso, NatureCNNTorso) and nature.torso.uint8_scale == pytest.approx(1 / 255)
    flat = build_agent(box((4, 10, 10), bool), gym.spaces.Discrete(6), torso="mlp", hidden_sizes=(8,))
    assert flat.torso.input_size == 400 and flat.torso.output_size == 8
    out, _ = minatar(AgentInput(torch.zeros(2, 3, 4, 10, 10, dtype=torch.bool), torch.zeros(2, 3, dtype=torch.int64),
                                torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)), ())
    assert out.policy.shape == (2, 3, 6) and out.value.shape == (2, 3)


@pytest.mark.parametrize(
    "action_space, needle",
    [
        (gym.spaces.Box(-1.0, 1.0, (3, 2), np.float32), "Box(-1.0, 1.0, (3, 2), float32)"),
        (gym.spaces.MultiDiscrete([3, 4]), "MultiDiscrete([3 4])"),
        (gym.spaces.Box(np.zeros((40, 2), np.float32), np.ones((40, 2), np.float32)), "Box("),
        (gym.spaces.Box(0, 5, (3,), np.int64), "Box(0, 5, (3,), int64)"),
    ],
)
def test_build_agent_rejects_unsupported_actions(action_space, needle):
    obs = gym.spaces.Box(-1, 1, (4,), np.float32)
    with pytest.raises(UserError) as info:
        build_agent(obs, action_space)
    msg = str(info.value)
    assert "\n" not in msg and needle in msg and "Discrete" in msg
    if isinstance(action_space, gym.spaces.Box):
        assert "1-D float Box" in msg


@pytest.mark.parametrize("torso", ["shallow_cnn", "nature_cnn", "minatar", "resnet"])
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


# ----------------------------------------------------------------------------- Gaussian head


def _gaussian_params(shape=(6, 3), seed=0, std_scale=0.5):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(*shape, generator=g, dtype=torch.float64)
    log_std = torch.randn(*shape, generator=g, dtype=torch.float64) * std_scale
    return torch.cat([mean, log_std], dim=-1), mean, log_std


def test_gaussian_head_init_and_attributes():
    torch.manual_seed(0)
    head = GaussianHead(8, 3, log_std_init=-0.5)
    assert isinstance(head, PolicyHead)
    assert head.action_shape == (3,) and head.action_dtype == torch.float32
    assert head.params_shape == (6,) and head.action_encoding_size == 3
    assert torch.count_nonzero(head.linear.bias) == 0 and head.linear.weight.abs().max() < 0.05
    assert isinstance(head.log_std, torch.nn.Parameter) and head.log_std.shape == (3,)
    params = head(torch.randn(4, 5, 8))
    assert params.shape == (4, 5, 6)
    # State-independent log-std, broadcast over the batch.
    assert torch.equal(params[..., 3:], torch.full((4, 5, 3), -0.5))
    params.sum().backward()
    assert head.log_std.grad is not None and torch.equal(head.log_std.grad, torch.full((3,), 20.0))
    enc = head.encode_action(torch.ones(2, 3, dtype=torch.float64))
    assert enc.dtype == torch.float32 and enc.shape == (2, 3)


def test_gaussian_maths_matches_torch_distributions():
    head = GaussianHead(1, 3)
    p_params, p_mean, p_log_std = _gaussian_params(seed=0)
    q_params, q_mean, q_log_std = _gaussian_params(seed=1)
    p = Independent(Normal(p_mean, p_log_std.exp()), 1)
    q = Independent(Normal(q_mean, q_log_std.exp()), 1)
    actions = p.sample()
    torch.testing.assert_close(head.log_prob(p_params, actions), p.log_prob(actions))
    torch.testing.assert_close(head.entropy(p_params), p.entropy())
    torch.testing.assert_close(head.kl(p_params, q_params), kl_divergence(p, q))
    torch.testing.assert_close(head.kl(p_params, p_params), torch.zeros(6, dtype=torch.float64))
    assert torch.equal(head.mode(p_params), p_mean)
    # Sampling: shapes, moments, determinism with a generator.
    params = p_params[:1].expand(20_000, 6)
    samples = head.sample(params, generator=torch.Generator().manual_seed(3))
    assert samples.shape == (20_000, 3) and samples.dtype == torch.float64
    torch.testing.assert_close(samples.mean(0), p_mean[0], atol=0.05, rtol=0)
    torch.testing.assert_close(samples.std(0), p_log_std[0].exp(), atol=0.05, rtol=0.02)
    again = head.sample(params, generator=torch.Generator().manual_seed(3))
    assert torch.equal(samples, again)


def _squashed_reference(mean, log_std, low, high):
    base = Normal(mean, log_std.exp())
    loc, scale = (high + low) / 2, (high - low) / 2
    transforms = [TanhTransform(cache_size=1), AffineTransform(loc, scale)]
    return Independent(TransformedDistribution(base, transforms), 1)


def test_squashed_gaussian_log_prob_matches_transformed_distribution():
    low = torch.tensor([-1.0, 0.0, -3.0])
    high = torch.tensor([1.0, 2.0, 0.5])
    head = GaussianHead(1, 3, squash=True, action_low=low, action_high=high).double()
    params, mean, log_std = _gaussian_params((50, 3), seed=4)
    ref = _squashed_reference(mean, log_std, low.double(), high.double())
    actions = ref.sample()  # [50, 3]
    ref_logp = ref.log_prob(actions)  # cache -> exact pre-tanh values
    # The head inverts the squash with atanh clamped to ±(1 - 1e-6): exact away from saturation.
    y = (actions - (high + low).double() / 2) / ((high - low).double() / 2)
    inside = (y.abs() < 1 - 1e-6).all(-1)
    assert inside.sum() >= 45
    logp = head.log_prob(params, actions)
    torch.testing.assert_close(logp[inside], ref_logp[inside], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(logp).all()
    # Entropy and KL are those of the underlying Gaussian (KL exactly so).
    base = Independent(Normal(mean, log_std.exp()), 1)
    torch.testing.assert_close(head.entropy(params), base.entropy())
    params_q, mean_q, log_std_q = _gaussian_params((50, 3), seed=5)
    torch.testing.assert_close(
        head.kl(params, params_q), kl_divergence(base, Independent(Normal(mean_q, log_std_q.exp()), 1))
    )
    mode = head.mode(params)
    torch.testing.assert_close(mode, (high + low).double() / 2 + (high - low).double() / 2 * torch.tanh(mean))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_squashed_samples_stay_in_bounds_with_finite_log_prob(dtype):
    low = torch.tensor([-0.4, 2.0])
    high = torch.tensor([0.4, 5.0])
    head = GaussianHead(1, 2, squash=True, action_low=low, action_high=high).to(dtype)
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(4000, 2, generator=g, dtype=dtype) * 5  # many saturated samples
    log_std = torch.randn(4000, 2, generator=g, dtype=dtype)
    params = torch.cat([mean, log_std], dim=-1)
    actions = head.sample(params, generator=g)
    assert actions.dtype == dtype
    assert (actions >= low.to(dtype)).all() and (actions <= high.to(dtype)).all()
    logp = head.log_prob(params, actions)
    assert logp.shape == (4000,) and torch.isfinite(logp).all()
    # Actions exactly on the bounds are clamped before atanh: still finite.
    edge = torch.stack([low, high]).to(dtype)
    assert torch.isfinite(head.log_prob(params[:2], edge)).all()
    # Actions as float32 (what the rollout stores) against float64 params.
    assert torch.isfinite(head.log_prob(params.double(), actions.float())).all()


# ------------------------------------------------------------------------------ RunningNorm


def test_running_norm_matches_numpy_over_several_updates():
    rng = np.random.default_rng(0)
    norm = RunningNorm((3,))
    assert {"mean", "var", "count"} <= set(norm.state_dict())
    assert not list(norm.parameters())
    x0 = torch.randn(5, 3)
    torch.testing.assert_close(norm(x0), x0, atol=1e-6, rtol=0)  # initial stats: identity
    seen = []
    for size in (1, 7, 64, 3, (4, 5)):  # different batch sizes, also [T, B, 3]
        shape = (size, 3) if isinstance(size, int) else (*size, 3)
        batch = rng.normal(loc=[1.0, -2.0, 50.0], scale=[0.5, 3.0, 10.0], size=shape)
        norm.update(torch.from_numpy(batch))
        seen.append(batch.reshape(-1, 3))
    data = np.concatenate(seen)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-7)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-7)
    assert norm.count.item() == pytest.approx(len(data) + 1e-8)
    # forward uses the stats, never updates them, computes in float32 and clips.
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    obs = torch.from_numpy(data[:10])
    out = norm(obs)
    assert out.dtype == torch.float32
    expected = (data[:10] - data.mean(0)) / np.sqrt(data.var(0) + 1e-8)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())
    far = norm(torch.tensor([[1e6, -1e6, 50.0]]))
    assert far[0, 0] == 10.0 and far[0, 1] == -10.0
    # The statistics stay float64 through dtype casts.
    norm.float()
    assert norm.mean.dtype == norm.var.dtype == norm.count.dtype == torch.float64


# --------------------------------------------------------------------------- MuJoCo agents


@pytest.fixture(scope="module")
def hopper_spaces():
    env = gym.make("Hopper-v5")
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def _hopper_inputs(obs_space, act_space, T, B, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(T, B, *obs_space.shape, generator=g, dtype=torch.float64) * 3 + 1
    first = torch.zeros(T, B, dtype=torch.bool)
    first[0] = True
    return AgentInput(
        obs=obs,
        prev_action=torch.rand(T, B, *act_space.shape, generator=g) * 2 - 1,
        prev_reward=torch.randn(T, B, generator=g),
        first=first,
    )


def test_hopper_agent_with_obs_norm_and_separate_value_network(hopper_spaces):
    obs_space, act_space = hopper_spaces
    torch.manual_seed(0)
    agent = build_agent(obs_space, act_space, normalize_observations=True, separate_value_network=True,
                        log_std_init=-0.5)
    head = agent.policy_head
    assert isinstance(head, GaussianHead) and not head.squash and head.action_shape == (3,)
    assert isinstance(agent.obs_norm, RunningNorm) and agent.obs_norm.shape == (11,)
    assert isinstance(agent.torso, MLPTorso) and isinstance(agent.value_torso, MLPTorso)
    assert agent.torso is not agent.value_torso and agent.value_head.linear.in_features == 64
    T, B = 4, 3
    inputs = _hopper_inputs(obs_space, act_space, T, B)
    agent.obs_norm.update(inputs.obs)
    out, state = agent(inputs, agent.initial_state(B))
    assert state == () and out.policy.shape == (T, B, 6) and out.value.shape == (T, B)
    actions = head.sample(out.policy)
    assert actions.shape == (T, B, 3) and actions.dtype == torch.float32 and not actions.requires_grad
    loss = -head.log_prob(out.policy, actions).mean() + out.value.pow(2).mean()
    loss.backward()
    for name, p in agent.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # The policy does not depend on the value torso and vice versa.
    with torch.no_grad():
        agent.value_torso.layers[0].weight.add_(1.0)
        out2, _ = agent(inputs, ())
    assert torch.equal(out2.policy, out.policy) and not torch.allclose(out2.value, out.value)

    # Weights (with the normalisation statistics) travel through the state_dict.
    torch.manual_seed(1)
    other = build_agent(obs_space, act_space, normalize_observations=True, separate_value_network=True)
    assert not torch.equal(other.obs_norm.mean, agent.obs_norm.mean)
    other.load_state_dict(agent.state_dict())
    torch.testing.assert_close(other.obs_norm(inputs.obs), agent.obs_norm(inputs.obs), rtol=0, atol=0)
    with torch.no_grad():
        out_a, _ = agent(inputs, ())
        out_b, _ = other(inputs, ())
    torch.testing.assert_close(out_b.policy, out_a.policy, rtol=0, atol=0)
    torch.testing.assert_close(out_b.value, out_a.value, rtol=0, atol=0)


def test_hopper_squashed_agent_with_lstm(hopper_spaces):
    obs_space, act_space = hopper_spaces
    agent = build_agent(obs_space, act_space, squash_actions=True, use_lstm=True, lstm_size=16)
    head = agent.policy_head
    assert head.squash and agent.obs_norm is None and agent.value_torso is None
    assert agent.core.input_size == 64 + 1 + 3
    T, B = 3, 2
    out, state = agent(_hopper_inputs(obs_space, act_space, T, B), agent.initial_state(B))
    actions = head.sample(out.policy)
    low, high = torch.from_numpy(act_space.low), torch.from_numpy(act_space.high)
    assert (actions >= low).all() and (actions <= high).all()
    assert torch.isfinite(head.log_prob(out.policy, actions)).all()


def test_build_agent_default_is_unchanged_by_new_options():
    obs = gym.spaces.Box(-1, 1, (4,), np.float32)
    torch.manual_seed(0)
    a = build_agent(obs, gym.spaces.Discrete(3))
    torch.manual_seed(0)
    b = build_agent(obs, gym.spaces.Discrete(3), normalize_observations=False, separate_value_network=False,
                    squash_actions=False)
    assert a.obs_norm is None and a.value_torso is None
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert isinstance(a.policy_head, CategoricalHead)


def test_build_agent_continuous_user_errors():
    vec = gym.spaces.Box(-1, 1, (4,), np.float32)
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    # Unbounded actions are fine without squashing...
    assert isinstance(build_agent(vec, unbounded).policy_head, GaussianHead)
    # ...but not with it.
    with pytest.raises(UserError) as info:
        build_agent(vec, unbounded, squash_actions=True)
    msg = str(info.value)
    assert "\n" not in msg and "finite" in msg and "Box(-inf, inf, (2,), float32)" in msg
    with pytest.raises(UserError, match="use_lstm"):
        build_agent(vec, gym.spaces.Discrete(2), separate_value_network=True, use_lstm=True)
    with pytest.raises(UserError, match="1-D float observations or uint8 pixel frames"):
        build_agent(gym.spaces.Box(0, 1, (4, 10, 10), np.uint8), gym.spaces.Discrete(2), normalize_observations=True)
    with pytest.raises(UserError, match="1-D float observations"):
        build_agent(gym.spaces.Box(0, 1, (4,), np.int64), gym.spaces.Discrete(2), normalize_observations=True)


def test_pixel_frames_are_centred_on_their_running_mean_not_divided_by_their_std():
    """A pixel that never changes stays at 0 instead of blowing up, and the torso sees (x − mean) / 255."""
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    agent = build_agent(image, gym.spaces.Discrete(3), normalize_observations=True)
    frames = torch.full((16, 4, 84, 84), 100, dtype=torch.uint8)
    frames[::2, :, 40, 40] = 200  # one pixel that changes
    agent.obs_norm.update(frames)
    centred = agent.obs_norm(frames)
    expected = (frames.double() - frames.double().mean(0)) / 255
    torch.testing.assert_close(centred.double(), expected, rtol=0, atol=1e-6)
    assert float(centred[:, :, 0, 0].abs().max()) == 0.0
