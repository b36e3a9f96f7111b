"""The agent: torso → (optional LSTM core) → policy head and value head, time-major.

Inputs are ``[T, B, ...]``. The torso sees ``T·B`` observations at once. With an LSTM, the core
input at step t is ``concat[features, clip(prev_reward, -1, 1), policy_head.encode_action(
prev_action)]`` and the ``nn.LSTMCell`` is stepped over T in a Python loop, the state being reset
to zeros for batch entries whose ``first[t]`` is True BEFORE step t (docs/algorithms.md#lstm-core).
So an unroll of T steps at once equals T one-step calls carrying the state (actors vs learner).

A multi-task agent (``num_tasks > 1``) shares the torso and core and has a policy head and a
value output per task (``TaskCategoricalHead``, ``ValueHead(num_outputs=num_tasks)``); each entry
uses its own task's, chosen by ``AgentInput.task``. With PopArt the value head is a
``PopArtValueHead``: ``AgentOutput.value`` is then unnormalised, ``normalized_value`` is n(x).

Optionally a ``RunningNorm`` (``agent.obs_norm``) normalises observations before the torso, and
a separate value torso (``agent.value_torso``, CleanRL's MuJoCo PPO architecture) feeds the
value head instead of the shared features (feed-forward agents only).
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
from impactrl.models.heads import (
    CategoricalHead,
    GaussianHead,
    PolicyHead,
    PopArtValueHead,
    TaskCategoricalHead,
    ValueHead,
)
from impactrl.models.normalization import RunningNorm
from impactrl.models.torsos import (
    ATARI_SCALE,
    MinAtarTorso,
    MLPTorso,
    NatureCNNTorso,
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
    task: Tensor | None = None  # [T, B] int64: the task of each entry (multi-task agents); None = task 0


LOW_PRECISION = (torch.bfloat16, torch.float16)


class AgentOutput(NamedTuple):
    policy: Tensor  # [T, B, *params_shape] distribution parameters (logits for categorical)
    value: Tensor  # [T, B]: V(x) of each entry's task (unnormalised with PopArt)
    normalized_value: Tensor | None = None  # [T, B] PopArt's n(x), V = σ n + μ; None without PopArt


class Agent(nn.Module):
    """Composes a torso, an optional LSTM core, a policy head and a value head.

    Args:
        torso: module mapping ``[N, *obs_shape]`` to ``[N, torso.output_size]``.
        policy_head_factory: ``core_output_size -> PolicyHead`` (e.g.
            ``lambda n: CategoricalHead(n, num_actions)``); the heads read the core's output.
        use_lstm: put an ``nn.LSTMCell(lstm_size)`` between torso and heads.
        lstm_size: LSTM hidden size.
        value_head_factory: ``core_output_size -> nn.Module``; defaults to ``ValueHead(n)``.
            With ``value_torso`` it gets ``value_torso.output_size`` instead.
        obs_norm: module applied to the observations ``[T, B, *obs_shape]`` before the torso(s)
            (a ``RunningNorm``); ``None`` for none.
        value_torso: a second torso feeding only the value head (no shared features); the
            policy head then reads ``torso`` alone. Not allowed with an LSTM.
        num_tasks: tasks the policy head and value head serve (the heads' factories must make
            heads with that many tasks/outputs); 1 = a single-task agent.
    """

    def __init__(
        self,
        torso: nn.Module,
        policy_head_factory: Callable[[int], PolicyHead],
        use_lstm: bool,
        lstm_size: int = 256,
        *,
        value_head_factory: Callable[[int], nn.Module] | None = None,
        obs_norm: nn.Module | None = None,
        value_torso: nn.Module | None = None,
        num_tasks: int = 1,
    ) -> None:
        super().__init__()
        self.num_tasks = int(num_tasks)
        if use_lstm and int(lstm_size) < 1:
            raise UserError(f"lstm_size must be positive, got {lstm_size}")
        if use_lstm and value_torso is not None:
            raise UserError("a separate value network needs a feed-forward agent: turn off use_lstm")
        self.obs_norm = obs_norm
        self.torso = torso
        self.use_lstm = bool(use_lstm)
        self.lstm_size = int(lstm_size) if self.use_lstm else 0
        self.core_output_size = self.lstm_size if self.use_lstm else int(torso.output_size)
        self.policy_head = policy_head_factory(self.core_output_size)
        if not isinstance(self.policy_head, PolicyHead):
            raise TypeError(f"policy_head_factory returned {type(self.policy_head).__name__}, not a PolicyHead")
        make_value = value_head_factory if value_head_factory is not None else ValueHead
        self.value_torso = value_torso
        value_input = self.core_output_size if value_torso is None else int(value_torso.output_size)
        self.value_head = make_value(value_input)
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

    def dead_unit_fractions(self, obs: Tensor) -> list[float]:
        """The torso's ``dead_unit_fractions`` on observations ``[N, *obs_shape]`` as it sees them
        (after ``obs_norm``)."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        return self.torso.dead_unit_fractions(obs)

    def forward(self, inputs: AgentInput, core_state: CoreState) -> tuple[AgentOutput, CoreState]:
        obs = inputs.obs
        T, B = obs.shape[:2]
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        flat_obs = obs.reshape((T * B,) + tuple(obs.shape[2:]))
        features = self.torso(flat_obs)
        if self.core is None:
            core_out = features.reshape(T, B, -1)
            new_state = core_state
        else:
            core_out, new_state = self._unroll(features, inputs, core_state, T, B)
        task = inputs.task
        policy = self.policy_head(core_out, task) if self.num_tasks > 1 else self.policy_head(core_out)
        if self.value_torso is None:
            value = self.value_head(core_out)
        else:
            value = self.value_head(self.value_torso(flat_obs).reshape(T, B, -1))
        if policy.dtype in LOW_PRECISION:
            # Under autocast the heads' matmuls give bfloat16/float16; the losses' maths
            # (log-softmax, V-trace, GAE) stays in float32.
            policy, value = policy.float(), value.float()
        if value.dim() == 3:  # one output per task: each entry's own
            value = value.gather(-1, task.unsqueeze(-1)).squeeze(-1) if task is not None else value[..., 0]
        if isinstance(self.value_head, PopArtValueHead):
            return AgentOutput(policy, self.value_head.unnormalize(value, task), value), new_state
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

_IMAGE_TORSOS = {"minatar": MinAtarTorso, "shallow_cnn": ShallowCNNTorso, "nature_cnn": NatureCNNTorso,
                 "resnet": ResNetTorso}
_TORSOS = ("mlp", *_IMAGE_TORSOS)
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
    return _IMAGE_TORSOS[torso](*shape, uint8_scale=scale)


def _check_action_space(action_space: gym.Space) -> int:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise UserError(
            f"action space {_describe(action_space)} is not supported: impactrl handles Discrete actions "
            f"and 1-D float Box actions"
        )
    if int(action_space.start) != 0:
        raise UserError(
            f"action space {_describe(action_space)} is not supported: Discrete actions must start at 0"
        )
    return int(action_space.n)


def _policy_head_factory(
    action_space: gym.Space, *, squash_actions: bool, log_std_init: float,
    task_num_actions: tuple[int, ...] | None = None,
) -> Callable[[int], PolicyHead]:
    """Categorical head for Discrete spaces, Gaussian head for 1-D float Box spaces; a
    ``TaskCategoricalHead`` for several tasks (Discrete only)."""
    if task_num_actions is not None and len(task_num_actions) > 1:
        if not isinstance(action_space, gym.spaces.Discrete):
            raise UserError(f"a multi-task agent needs Discrete actions, but the action space is {_describe(action_space)}")
        return lambda n: TaskCategoricalHead(n, tuple(task_num_actions))
    if not isinstance(action_space, gym.spaces.Box):
        num_actions = _check_action_space(action_space)
        return lambda n: CategoricalHead(n, num_actions)
    if len(action_space.shape) != 1 or not np.issubdtype(action_space.dtype, np.floating):
        raise UserError(
            f"action space {_describe(action_space)} is not supported: continuous actions must be a 1-D "
            f"float Box (Discrete actions are supported too)"
        )
    action_size = int(action_space.shape[0])
    if not squash_actions:
        return lambda n: GaussianHead(n, action_size, log_std_init=log_std_init)
    low = np.asarray(action_space.low, dtype=np.float64)
    high = np.asarray(action_space.high, dtype=np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()) or not (high > low).all():
        raise UserError(
            f"squash_actions needs finite action bounds with low < high, but the action space is "
            f"{_describe(action_space)}; turn squash_actions off"
        )
    low_t = torch.as_tensor(low, dtype=torch.float32)
    high_t = torch.as_tensor(high, dtype=torch.float32)
    return lambda n: GaussianHead(
        n, action_size, log_std_init=log_std_init, squash=True, action_low=low_t, action_high=high_t
    )


def _build_obs_norm(observation_space: gym.Space) -> RunningNorm:
    """Per-feature mean and std for 1-D float observations; for pixel frames (uint8, 0–255) the
    per-pixel mean only, scaled like the torso's frames (1/255). Centred frames keep a first
    convolution's units alive: on frames that barely change, an uncentred filter's response is
    its weights' sum times the background, which updates that move all its weights one way push
    below zero on every frame for good (docs/studies.md#pong-the-dying-first-convolution)."""
    if isinstance(observation_space, gym.spaces.Box) and len(observation_space.shape) == 1 \
            and np.issubdtype(observation_space.dtype, np.floating):
        return RunningNorm(observation_space.shape)
    if isinstance(observation_space, gym.spaces.Box) and _uint8_scale(observation_space) != 1.0:
        return RunningNorm(observation_space.shape, fixed_scale=_uint8_scale(observation_space))
    raise UserError(
        f"normalize_observations needs 1-D float observations or uint8 pixel frames, but the observation "
        f"space is {_describe(observation_space)}"
    )


def build_agent(
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    torso: str = "auto",
    hidden_sizes: Sequence[int] = (64, 64),
    use_lstm: bool = False,
    lstm_size: int = 256,
    normalize_observations: bool = False,
    squash_actions: bool = False,
    log_std_init: float = 0.0,
    separate_value_network: bool = False,
    task_num_actions: Sequence[int] | None = None,
    popart_beta: float | None = None,
) -> Agent:
    """Build an agent for gymnasium spaces; raises ``UserError`` for unsupported combinations.

    ``torso="auto"`` picks "mlp" for 1-D observations, "minatar" for (C, H, W) images with
    H, W ≤ 16, "shallow_cnn" for larger images; "nature_cnn" and "resnet" only when asked.

    Discrete actions get a ``CategoricalHead``; 1-D float Box actions a ``GaussianHead`` with a
    state-independent log-std starting at ``log_std_init``. With ``squash_actions`` the Gaussian
    is tanh-squashed into the space's (finite) bounds; without it actions are unbounded and the
    environment side should clip them. ``squash_actions`` / ``log_std_init`` do nothing for
    Discrete actions.

    ``normalize_observations`` puts a ``RunningNorm`` (``agent.obs_norm``) in front of the torso
    (1-D float observations: mean and std; uint8 pixel frames: the mean only); the learner must
    call ``agent.obs_norm.update(obs)`` itself.
    ``separate_value_network`` gives the value head its own torso of the same kind
    (``agent.value_torso``), as in CleanRL's MuJoCo PPO; feed-forward agents only.

    ``task_num_actions`` (one action count per task, for several tasks sharing the torso) makes
    a multi-task agent over Discrete ``action_space`` (``Discrete(max(task_num_actions))``);
    ``popart_beta`` gives it (or a single-task agent) a PopArt value head with that step size.
    """
    num_tasks = len(task_num_actions) if task_num_actions is not None else 1
    head_factory = _policy_head_factory(action_space, squash_actions=squash_actions, log_std_init=log_std_init,
                                        task_num_actions=tuple(task_num_actions) if num_tasks > 1 else None)
    value_head_factory: Callable[[int], nn.Module] = (
        (lambda n: PopArtValueHead(n, num_tasks, popart_beta)) if popart_beta is not None
        else (lambda n: ValueHead(n, num_tasks)))
    if separate_value_network and use_lstm:
        raise UserError("separate_value_network needs a feed-forward agent: turn off use_lstm")
    obs_norm = _build_obs_norm(observation_space) if normalize_observations else None
    torso_module = build_torso(observation_space, torso, hidden_sizes=hidden_sizes)
    value_torso = (
        build_torso(observation_space, torso, hidden_sizes=hidden_sizes) if separate_value_network else None
    )
    return Agent(
        torso_module,
        head_factory,
        use_lstm=use_lstm,
        lstm_size=lstm_size,
        obs_norm=obs_norm,
        value_torso=value_torso,
        value_head_factory=value_head_factory,
        num_tasks=num_tasks,
    )
