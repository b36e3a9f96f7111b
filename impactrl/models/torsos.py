"""Torsos: observation encoders mapping ``[N, *obs_shape]`` to features ``[N, output_size]``.

Every torso casts the raw observation itself (to the dtype of its own parameters, so a
``.double()`` model takes float64): ``uint8`` observations are multiplied by ``uint8_scale``
(1/255 by default for the Atari networks, 1 for MinAtar planes and the MLP); any other dtype
(bool, float) is just cast. Image torsos expect channels-first ``(C, H, W)`` observations.

Architectures follow the IMPALA paper (Fig. 3) and the MinAtar paper: docs/algorithms.md#network-architectures.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from impactrl.errors import UserError

__all__ = [
    "MLPTorso", "MinAtarTorso", "ShallowCNNTorso", "NatureCNNTorso", "ResNetTorso", "learner_channels_last", "DEAD_UNIT_SAMPLE",
]

ATARI_SCALE = 1.0 / 255.0
DEAD_UNIT_SAMPLE = 512  # observations a dead-unit count looks at (the learner's per metrics line, eval's)


class _Torso(nn.Module):
    """Shared helpers: the observation cast and the output size."""

    output_size: int
    # Whether a CPU learner keeps this torso channels-last (learner_channels_last): oneDNN's NHWC
    # kernels made the learner's step on the 84x84 Atari nets faster and MinAtar's slower
    # (benchmarks/README.md).
    faster_channels_last = False

    def __init__(self, uint8_scale: float) -> None:
        super().__init__()
        self.uint8_scale = float(uint8_scale)
        self.channels_last = False

    def use_channels_last(self) -> None:
        """Convolution weights channels-last, and observations cast straight into that layout."""
        self.to(memory_format=torch.channels_last)
        self.channels_last = True

    def _param_dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @torch.no_grad()
    def dead_unit_fractions(self, obs: Tensor) -> list[float]:
        """For each ``nn.ReLU`` on the torso's main path, in call order: the share of its units
        (a convolution's channels) that are zero on every observation of ``obs`` ``[N, *obs_shape]``.

        Such a unit passes no gradient, so nothing revives it; a layer at 1.0 makes the features,
        and so the policy and value, independent of the observation. Residual branches use
        ``F.relu`` and are not counted (the skip path carries the signal past them); a torso
        without ReLU layers (the tanh MLP) gives an empty list.
        """
        outputs: list[Tensor] = []
        hooks = [module.register_forward_hook(lambda _module, _inputs, output: outputs.append(output))
                 for module in self.modules() if isinstance(module, nn.ReLU)]
        try:
            self(obs)
        finally:
            for hook in hooks:
                hook.remove()
        return [float((output.transpose(0, 1).flatten(1).amax(1) <= 0).float().mean()) for output in outputs]

    def _cast(self, obs: Tensor) -> Tensor:
        layout = torch.channels_last if self.channels_last and obs.dim() == 4 else torch.preserve_format
        x = obs.to(self._param_dtype(), memory_format=layout)
        if obs.dtype == torch.uint8 and self.uint8_scale != 1.0:
            x.mul_(self.uint8_scale)  # x is a new tensor here: in place saves a pass over a large batch
        return x


def _check_image(name: str, in_channels: int, height: int, width: int, min_size: int) -> None:
    if min(in_channels, height, width) < 1 or min(height, width) < min_size:
        raise UserError(
            f"{name} needs channels-first (C, H, W) observations at least {min_size}x{min_size}, "
            f"got (C, H, W) = ({in_channels}, {height}, {width})"
        )


def _orthogonal_init(module: nn.Module) -> None:
    """Orthogonal weights (gain √2) and zero biases for every linear and convolution layer.

    On Atari the shallow CNN's first layer sees nearly uniform frames, so a filter's response is
    mostly the sum of its weights; PyTorch's default init leaves that sum small against the
    optimiser's normalised steps, and most filters died within 200k Pong steps (docs/results.md).
    """
    for layer in module.modules():
        if isinstance(layer, (nn.Linear, nn.Conv2d)):
            nn.init.orthogonal_(layer.weight, gain=math.sqrt(2.0))
            nn.init.zeros_(layer.bias)


def _flat_size(net: nn.Module, in_channels: int, height: int, width: int) -> int:
    with torch.no_grad():
        return int(net(torch.zeros(1, in_channels, height, width)).flatten(1).shape[1])


class MLPTorso(_Torso):
    """Flatten → [Linear → activation] per hidden size. Orthogonal init (gain √2), zero bias.

    With ``hidden_sizes=()`` it only flattens (``output_size == input_size``).
    """

    def __init__(
        self,
        input_size: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: Callable[[Tensor], Tensor] = torch.tanh,
        *,
        uint8_scale: float = 1.0,
    ) -> None:
        super().__init__(uint8_scale)
        sizes = [int(input_size), *(int(h) for h in hidden_sizes)]
        if min(sizes) < 1:
            raise UserError(f"MLP sizes must be positive, got input {input_size}, hidden {tuple(hidden_sizes)}")
        self.input_size = sizes[0]
        self.activation = activation
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        _orthogonal_init(self.layers)
        self.output_size = sizes[-1]
        # A parameterless MLP still needs a dtype to cast to.
        if not self.layers:
            self.register_buffer("_dtype_probe", torch.zeros(()), persistent=False)

    def _param_dtype(self) -> torch.dtype:
        if self.layers:
            return self.layers[0].weight.dtype
        return self._dtype_probe.dtype

    def forward(self, obs: Tensor) -> Tensor:
        x = self._cast(obs).reshape(obs.shape[0], -1)
        for layer in self.layers:
            x = self.activation(layer(x))
        return x


class MinAtarTorso(_Torso):
    """MinAtar paper network: conv 16 3×3 s1 (valid) → ReLU → flatten → FC 128 → ReLU."""

    def __init__(self, in_channels: int, height: int, width: int, *, uint8_scale: float = 1.0) -> None:
        super().__init__(uint8_scale)
        _check_image("minatar torso", in_channels, height, width, 3)
        self.conv = nn.Conv2d(in_channels, 16, kernel_size=3, stride=1)
        flat = _flat_size(self.conv, in_channels, height, width)
        self.fc = nn.Linear(flat, 128)
        self.conv_relu, self.fc_relu = nn.ReLU(), nn.ReLU()  # modules, so dead_unit_fractions sees them
        self.output_size = 128

    def forward(self, obs: Tensor) -> Tensor:
        x = self.conv_relu(self.conv(self._cast(obs)))
        return self.fc_relu(self.fc(x.flatten(1)))


class _ConvStackTorso(_Torso):
    """Convolutions, each → ReLU, then FC → ReLU; orthogonal init (gain √2), zero bias. A subclass
    names its layers: ``conv_layers`` as (channels, kernel, stride), ``fc_size``, ``min_size``."""

    faster_channels_last = True
    name: str
    conv_layers: tuple[tuple[int, int, int], ...]
    fc_size: int
    min_size: int  # the smallest height and width the convolutions leave a feature map for

    def __init__(
        self, in_channels: int, height: int, width: int, *, uint8_scale: float = ATARI_SCALE
    ) -> None:
        super().__init__(uint8_scale)
        _check_image(f"{self.name} torso", in_channels, height, width, self.min_size)
        layers: list[nn.Module] = []
        channels = in_channels
        for out, kernel, stride in self.conv_layers:
            layers += [nn.Conv2d(channels, out, kernel_size=kernel, stride=stride), nn.ReLU()]
            channels = out
        self.convs = nn.Sequential(*layers)
        flat = _flat_size(self.convs, in_channels, height, width)
        self.fc = nn.Linear(flat, self.fc_size)
        self.fc_relu = nn.ReLU()
        self.output_size = self.fc_size
        _orthogonal_init(self)

    def forward(self, obs: Tensor) -> Tensor:
        x = self.convs(self._cast(obs))
        return self.fc_relu(self.fc(x.flatten(1)))


class ShallowCNNTorso(_ConvStackTorso):
    """IMPALA shallow net: conv 16 8×8 s4 → ReLU → conv 32 4×4 s2 → ReLU → FC 256 → ReLU."""

    name = "shallow_cnn"
    conv_layers = ((16, 8, 4), (32, 4, 2))
    fc_size = 256
    min_size = 20


class NatureCNNTorso(_ConvStackTorso):
    """The DQN Nature paper's net (CleanRL's and Stable-Baselines3's Atari default): conv 32 8×8 s4
    → ReLU → conv 64 4×4 s2 → ReLU → conv 64 3×3 s1 → ReLU → FC 512 → ReLU."""

    name = "nature_cnn"
    conv_layers = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
    fc_size = 512
    min_size = 36


class _ResidualBlock(nn.Module):
    """ReLU → conv 3×3 → ReLU → conv 3×3 → + input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, stride=1, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv0(F.relu(x))
        y = self.conv1(F.relu(y))
        return x + y


class _ResNetSection(nn.Module):
    """conv 3×3 s1 same → max-pool 3×3 s2 (padding 1) → two residual blocks."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=1, padding=1)
        self.pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.res0 = _ResidualBlock(out_channels)
        self.res1 = _ResidualBlock(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.res1(self.res0(self.pool(self.conv(x))))


class ResNetTorso(_Torso):
    """IMPALA deep (15-conv) net: sections of 16, 32, 32 channels → ReLU → FC 256 → ReLU.

    84×84 input flattens to 32·11·11 = 3872 features before the FC layer.
    """

    faster_channels_last = True

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        channels: Sequence[int] = (16, 32, 32),
        uint8_scale: float = ATARI_SCALE,
    ) -> None:
        super().__init__(uint8_scale)
        _check_image("resnet torso", in_channels, height, width, 1)
        sections = []
        c = in_channels
        for out in channels:
            sections.append(_ResNetSection(c, int(out)))
            c = int(out)
        self.sections = nn.Sequential(*sections)
        self.flat_size = _flat_size(self.sections, in_channels, height, width)
        self.fc = nn.Linear(self.flat_size, 256)
        self.sections_relu, self.fc_relu = nn.ReLU(), nn.ReLU()
        self.output_size = 256

    def forward(self, obs: Tensor) -> Tensor:
        x = self.sections_relu(self.sections(self._cast(obs)))
        return self.fc_relu(self.fc(x.flatten(1)))


def learner_channels_last(agent: nn.Module) -> None:
    """Switch the agent's torsos that run faster channels-last to that layout (a CPU learner's agent;
    actors keep their own contiguous copy, where it made no difference)."""
    for module in agent.modules():
        if isinstance(module, _Torso) and module.faster_channels_last:
            module.use_channels_last()
