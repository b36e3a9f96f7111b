"""Running observation normalisation that travels with the weights.

``RunningNorm`` keeps ``mean``, ``var`` and ``count`` as buffers, so they are part of
``state_dict()`` and reach the actors with every weight publication. Only the learner changes
them, by calling ``update`` explicitly on the observations of a batch; ``forward`` never
updates, so actors and learner normalise identically with the weights they hold.

The statistics follow gymnasium's ``RunningMeanStd`` (Chan et al. parallel merge, ``count``
starting at ``epsilon``, ``var`` at 1, ``mean`` at 0) and are kept in float64 whatever dtype the
module is cast to; ``forward`` computes ``clip((x − mean) / sqrt(var + eps), ±clip)`` in float32.
With ``fixed_scale`` (pixel frames) it computes ``(x − mean) · fixed_scale`` instead: centring without
the division, which would blow up pixels that almost never change into ±clip spikes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["RunningNorm"]

_STATS = ("mean", "var", "count")


class RunningNorm(nn.Module):
    """Normalise ``[..., *shape]`` inputs by running statistics; ``update`` merges a batch in.

    Args:
        shape: shape of one observation (the trailing dims of the inputs).
        clip: the normalised output is clipped to ``[-clip, clip]``.
        epsilon: initial ``count`` and the variance offset under the square root.
        fixed_scale: multiply the centred inputs by this instead of dividing them by their std.
    """

    def __init__(self, shape: int | Sequence[int], clip: float = 10.0, epsilon: float = 1e-8,
                 fixed_scale: float | None = None) -> None:
        super().__init__()
        self.fixed_scale = fixed_scale
        self.shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.register_buffer("mean", torch.zeros(self.shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(self.shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(self.epsilon, dtype=torch.float64))

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # Keep the statistics in float64 through .float() / .half() / .to(dtype): a float32
        # count stops growing exactly past 2**24 observations. Device moves still apply.
        super()._apply(fn, recurse)
        for name in _STATS:
            buf = self._buffers[name]
            if buf is not None and buf.dtype != torch.float64:
                self._buffers[name] = buf.to(torch.float64)
        return self

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.float32)
        mean = self.mean.to(torch.float32)
        if self.fixed_scale is not None:
            return (x - mean).mul_(self.fixed_scale)
        std = torch.sqrt(self.var + self.epsilon).to(torch.float32)
        return ((x - mean) / std).clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, batch: Tensor | np.ndarray, reduce: Callable[[Tensor], Tensor] = lambda sums: sums) -> None:
        """Merge the observations ``batch`` (``[..., *shape]``, any leading dims) into the stats.
        ``reduce`` sums over several learners' shards (their counts and sums, then their squares
        about the common mean), so that every learner merges in the whole batch's moments."""
        x = torch.as_tensor(batch).to(device=self.mean.device)
        if x.dim() < len(self.shape) or tuple(x.shape[x.dim() - len(self.shape):]) != self.shape:
            raise ValueError(f"RunningNorm of shape {self.shape} got a batch of shape {tuple(x.shape)}")
        x = x.reshape((-1,) + self.shape)
        # A frame batch's sum without a float64 copy of it; count and sum in one reduction.
        sums = reduce(torch.cat([self.count.new_full((1,), x.shape[0]), x.sum(dim=0, dtype=torch.float64).reshape(-1)]))
        # The count stays a device tensor (no host read); an empty batch, everywhere, changes nothing.
        batch_count, divisor = sums[0], sums[0].clamp_min(1.0)
        batch_mean = sums[1:].reshape(self.shape) / divisor
        delta = batch_mean - self.mean
        total = self.count + batch_count
        if self.fixed_scale is None:  # forward uses the variance only when it divides by the std
            batch_var = reduce((x.to(torch.float64) - batch_mean).square().sum(dim=0)) / divisor
            m2 = self.var * self.count + batch_var * batch_count + delta.square() * (self.count * batch_count / total)
            self.var.copy_(torch.where(batch_count > 0, m2 / total, self.var))
        self.mean.add_(torch.where(batch_count > 0, delta * (batch_count / total), 0.0))
        self.count.copy_(total)

    def extra_repr(self) -> str:
        scaling = f"clip={self.clip}" if self.fixed_scale is None else f"fixed_scale={self.fixed_scale:g}"
        return f"shape={self.shape}, {scaling}, epsilon={self.epsilon}"
