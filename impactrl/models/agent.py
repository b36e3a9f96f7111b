"""The agent: torso → (optional LSTM core) → policy head and value head, time-major.

Inputs are ``[T, B, ...]``. The torso sees ``T·B`` observations at once. With an LSTM, the core
input at step t is ``concat[features, clip(prev_reward, -1, 1), policy_head.encode_action(
prev_action)]`` and the ``nn.LSTMCell`` is stepped over T in a Python loop, the state being reset
to zeros for batch entries whose ``first[t]`` is True BEFORE step t (ALGORITHMS.md §a.5, §f).
So an unroll of T steps at once equals T one-step calls carrying the state (actors vs learner).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from impactrl.errors import UserError
from impactrl.models.heads import CategoricalHead, PolicyHead, ValueHead
from impactrl.models.torsos import (
    ATARI_SCALE,
    MinAtarTorso,
    MLPTorso,
    ResNetTorso,
    ShallowCNNTorso,
)

__all__ = [
    "AgentInput",
    "AgentOutput",
    "Agent",
    "build_agent",
    "build_torso",
    "supported_torsos",
]

CoreState = tuple[Tensor, ...]


class AgentInput(NamedTuple):
    obs: Tensor  # [T, B, *obs_shape], raw dtype (uint8 / bool / float32)
    prev_action: Tensor  # [T, B, *action_shape]: action taken before obs[t] (zeros at episode start)
    prev_reward: Tensor  # [T, B]: reward received before obs[t] (raw; clipped to [-1, 1] here)
    first: Tensor  # [T, B] bool: obs[t] is the first observation of an episode


class AgentOutput(NamedTuple):
    policy: Tensor  # [T, B, *params_shape] distribution parameters (logits for categorical)
    value: Tensor  # [T, B] (or [T, B, num_values] with a multi-output value head)


class Agent(nn.Module):
    """Composes a torso, an optional LSTM core, a policy head and a value head.

    Args:
        torso: module mapping ``[N, *obs_shape]`` to ``[N, torso.output_size]``.
        policy_head_factory: ``core_output_size -> PolicyHead`` (e.g.
            ``lambda n: CategoricalHead(n, num_actions)``); the heads read the core's output.
        use_lstm: put an ``nn.LSTMCell(lstm_size)`` between torso and heads.
        lstm_size: LSTM hidden size.
        value_head_factory: ``core_output_size -> nn.Module``; defaults to ``ValueHead(n)``.
    """

    def __init__(
        self,
        torso: nn.Module,
        policy_head_factory: Callable[[int], PolicyHead],
        use_lstm: bool,
        lstm_size: int = 256,
        *,
        value_head_factory: Callable[[int], nn.Module] | None = None,
    ) -> None:
        super().__init__()
        if use_lstm and int(lstm_size) < 1:
            raise UserError(f"lstm_size must be positive, got {lstm_size}")
        self.torso = torso
        self.use_lstm = bool(use_lstm)
        self.lstm_size = int(lstm_size) if self.use_lstm else 0
        self.core_output_size = self.lstm_size if self.use_lstm else int(torso.output_size)
        self.policy_head = policy_head_factory(self.core_output_size)
        if not isinstance(self.policy_head, PolicyHead):
            raise TypeError(f"policy_head_factory returned {type(self.policy_head).__name__}, not a PolicyHead")
        make_value = value_head_factory if value_head_factory is not None else ValueHead
        self.value_head = make_value(self.core_output_size)
        if self.use_lstm:
            core_input = int(torso.output_size) + 1 + int(self.policy_head.action_encoding_size)
            self.core: nn.LSTMCell | None = nn.LSTMCell(core_input, self.lstm_size)
        else:
            self.core = None

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> CoreState:
        """Zeros ``(h, c)``, each ``[batch_size, lstm_size]``; ``()`` without an LSTM."""
        if self.core is None:
            return ()
        weight = self.core.weight_hh
        device = weight.device if device is None else device
        return tuple(
            torch.zeros(batch_size, self.lstm_size, dtype=weight.dtype, device=device) for _ in range(2)
        )

    def forward(self, inputs: AgentInput, core_state: CoreState) -> tuple[AgentOutput, CoreState]:
        obs = inputs.obs
        T, B = obs.shape[:2]
        features = self.torso(obs.reshape((T * B,) + tuple(obs.shape[2:])))
        if self.core is None:
            core_out = features.reshape(T, B, -1)
            new_state = core_state
        else:
            core_out, new_state = self._unroll(features, inputs, core_state, T, B)
        policy = self.policy_head(core_out)
        value = self.value_head(core_out)
        return AgentOutput(policy=policy, value=value), new_state

    def _unroll(
        self, features: Tensor, inputs: AgentInput, core_state: CoreState, T: int, B: int
    ) -> tuple[Tensor, CoreState]:
        assert self.core is not None
        dtype = features.dtype
        reward = inputs.prev_reward.reshape(T * B, 1).to(dtype).clamp(-1.0, 1.0)
        head = self.policy_head
        prev_action = inputs.prev_action.reshape((T * B,) + tuple(head.action_shape))
        action_enc = head.encode_action(prev_action).to(dtype)
        x = torch.cat([features, reward, action_enc], dim=-1).reshape(T, B, -1)
        keep = (1.0 - inputs.first.to(dtype)).unsqueeze(-1)  # [T, B, 1]
        h, c = core_state
        outputs = []
        for t in range(T):
            h = h * keep[t]
            c = c * keep[t]
            h, c = self.core(x[t], (h, c))
            outputs.append(h)
        return torch.stack(outputs), (h, c)


# ---------------------------------------------------------------------------------------------
# Construction from gymnasium spaces.

_TORSOS = ("mlp", "minatar", "shallow_cnn", "resnet")
_IMAGE_TORSOS = ("minatar", "shallow_cnn", "resnet")
MINATAR_MAX_SIZE = 16


def supported_torsos() -> tuple[str, ...]:
    """Names accepted by ``build_agent(torso=...)`` besides ``"auto"``."""
    return _TORSOS


def _describe(space: gym.Space) -> str:
    """``str(space)`` on one line, shortened if huge (Box bounds print as arrays)."""
    text = " ".join(str(space).split())
    return text if len(text) <= 160 else text[:157] + "..."


def _uint8_scale(space: gym.spaces.Box) -> float:
    """1/255 for uint8 pixel frames; 1 for binary planes (MinAtar) and non-uint8 observations."""
    if space.dtype == np.uint8 and float(np.max(space.high)) > 1.0:
        return ATARI_SCALE
    return 1.0


def _auto_torso(shape: tuple[int, ...], space: gym.Space) -> str:
    if len(shape) <= 1:
        return "mlp"
    if len(shape) == 3:
        return "minatar" if max(shape[1:]) <= MINATAR_MAX_SIZE else "shallow_cnn"
    raise UserError(
        f"cannot pick a torso for observation space {_describe(space)}: expected 1-D vectors or "
        f"channels-first (C, H, W) images; pass torso='mlp' to flatten it"
    )


def build_torso(
    observation_space: gym.Space, torso: str = "auto", *, hidden_sizes: Sequence[int] = (64, 64)
) -> nn.Module:
    """Build the torso named ``torso`` (or picked automatically) for ``observation_space``."""
    if not isinstance(observation_space, gym.spaces.Box):
        raise UserError(
            f"observation space {_describe(observation_space)} is not supported: impactrl needs Box observations"
        )
    shape = tuple(int(s) for s in observation_space.shape)
    if torso == "auto":
        torso = _auto_torso(shape, observation_space)
    if torso not in _TORSOS:
        raise UserError(f"unknown torso {torso!r}: choose one of auto, {', '.join(_TORSOS)}")
    scale = _uint8_scale(observation_space)
    if torso == "mlp":
        hidden = tuple(hidden_sizes)
        if not all(isinstance(h, (int, np.integer)) and h > 0 for h in hidden):
            raise UserError(f"hidden_sizes must be positive integers, got {hidden}")
        return MLPTorso(math.prod(shape), hidden, uint8_scale=scale)
    if len(shape) != 3:
        raise UserError(
            f"torso {torso!r} needs channels-first (C, H, W) image observations, but the observation "
            f"space is {_describe(observation_space)}; use torso='mlp'"
        )
    cls = {"minatar": MinAtarTorso, "shallow_cnn": ShallowCNNTorso, "resnet": ResNetTorso}[torso]
    return cls(*shape, uint8_scale=scale)


def _check_action_space(action_space: gym.Space) -> int:
    if not isinstance(action_space, gym.spaces.Discrete):
        hint = " (continuous actions come with the Gaussian head)" if isinstance(action_space, gym.spaces.Box) else ""
        raise UserError(
            f"action space {_describe(action_space)} is not supported yet: impactrl handles Discrete actions{hint}"
        )
    if int(action_space.start) != 0:
        raise UserError(
            f"action space {_describe(action_space)} is not supported: Discrete actions must start at 0"
        )
    return int(action_space.n)


def build_agent(
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    torso: str = "auto",
    hidden_sizes: Sequence[int] = (64, 64),
    use_lstm: bool = False,
    lstm_size: int = 256,
) -> Agent:
    """Build an agent for gymnasium spaces; raises ``UserError`` for unsupported combinations.

    ``torso="auto"`` picks "mlp" for 1-D observations, "minatar" for (C, H, W) images with
    H, W ≤ 16, "shallow_cnn" for larger images; "resnet" only when asked.
    """
    num_actions = _check_action_space(action_space)
    torso_module = build_torso(observation_space, torso, hidden_sizes=hidden_sizes)
    return Agent(
        torso_module,
        lambda n: CategoricalHead(n, num_actions),
        use_lstm=use_lstm,
        lstm_size=lstm_size,
    )
