"""RMSProp in TensorFlow 1's form and in PyTorch's, each able to skip a step on the device
(docs/algorithms.md#rmsprop-tensorflows-form-and-pytorchs).

The IMPALA paper's hyperparameters are those of ``tf.train.RMSPropOptimizer``, which differs from
``torch.optim.RMSprop`` twice: ε sits under the square root, and the mean square starts at 1, so
the first steps are about ``lr · g`` instead of ``lr · sign(g)``. With the paper's ε = 0.01 the
smallest denominator is 0.1 here against 0.01 in PyTorch's form.

Both take ``found_inf`` as PyTorch's fused Adam does (an attribute, a 0-dim float tensor on the
parameters' device, read by ``step``): where it is 1 the step leaves the parameters and the
optimiser state as they were, decided without reading the flag on the host (no device sync).
"""
from __future__ import annotations

import torch
from torch import Tensor


def _masked(value: float, skip: Tensor | None, otherwise: float, like: Tensor) -> float | Tensor:
    """``value``, or on the device ``otherwise`` where ``skip`` is set (in ``like``'s dtype)."""
    return value if skip is None else torch.where(skip.bool(), otherwise, value).to(like.dtype)


class _RMSpropBase(torch.optim.Optimizer):
    """The mean square both forms keep, and the skip; ``_apply`` is each form's step from it."""

    square_avg_init: float  # the mean square's starting value

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 0.01, momentum: float = 0.0):
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "momentum": momentum})
        self.found_inf: Tensor | None = None  # 1: skip the next step (set by the caller, as GradScaler does)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = self.found_inf
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if "square_avg" not in self.state[p]:
                    self.state[p]["square_avg"] = torch.full_like(p, self.square_avg_init,
                                                                  memory_format=torch.preserve_format)
                if group["momentum"] and "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grads = [p.grad for p in params]
            if skip is not None:
                # A zero gradient with ρ and μ taken as 1 leaves both averages where they were.
                # A NaN would poison them through any product, so it is replaced first, in place
                # (nan_to_num and a multiply cost a tenth of a where over each gradient).
                for g in grads:
                    torch.nan_to_num_(g, nan=0.0, posinf=0.0, neginf=0.0)
                torch._foreach_mul_(grads, _masked(1.0, skip, 0.0, params[0]))
            square_avgs = [self.state[p]["square_avg"] for p in params]
            torch._foreach_mul_(square_avgs, _masked(group["alpha"], skip, 1.0, params[0]))
            torch._foreach_addcmul_(square_avgs, grads, grads, value=1.0 - group["alpha"])
            buffers = [self.state[p]["momentum_buffer"] for p in params] if group["momentum"] else None
            self._apply(params, grads, square_avgs, buffers, group, skip)
        return loss

    def _apply(self, params, grads, square_avgs, buffers, group, skip) -> None:
        raise NotImplementedError


class RMSpropTF(_RMSpropBase):
    """ms ← ρ·ms + (1 − ρ)·g²  (ms₀ = 1);  mom ← μ·mom + lr·g / √(ms + ε);  θ ← θ − mom.

    As in TensorFlow the learning rate multiplies the gradient before the momentum, so a changed
    learning rate acts on new gradients only."""

    square_avg_init = 1.0

    def _apply(self, params, grads, square_avgs, buffers, group, skip) -> None:
        denominators = torch._foreach_add(square_avgs, group["eps"])
        torch._foreach_sqrt_(denominators)
        if buffers is None:  # a zero gradient moves nothing
            torch._foreach_addcdiv_(params, grads, denominators, value=-group["lr"])
            return
        torch._foreach_mul_(buffers, _masked(group["momentum"], skip, 1.0, params[0]))
        torch._foreach_addcdiv_(buffers, grads, denominators, value=group["lr"])
        torch._foreach_sub_(params, buffers if skip is None else torch._foreach_mul(buffers, _masked(1.0, skip, 0.0, params[0])))


class RMSpropTorch(_RMSpropBase):
    """``torch.optim.RMSprop``'s update (not centred, no weight decay), with ``found_inf``:
    ms ← ρ·ms + (1 − ρ)·g²  (ms₀ = 0);  b ← μ·b + g / (√ms + ε);  θ ← θ − lr·b  (μ = 0: b = g / (√ms + ε))."""

    square_avg_init = 0.0

    def _apply(self, params, grads, square_avgs, buffers, group, skip) -> None:
        denominators = torch._foreach_sqrt(square_avgs)
        torch._foreach_add_(denominators, group["eps"])
        if buffers is None:
            torch._foreach_addcdiv_(params, grads, denominators, value=-group["lr"])
            return
        torch._foreach_mul_(buffers, _masked(group["momentum"], skip, 1.0, params[0]))
        torch._foreach_addcdiv_(buffers, grads, denominators)
        if skip is None:
            torch._foreach_add_(params, buffers, alpha=-group["lr"])
        else:
            torch._foreach_add_(params, torch._foreach_mul(buffers, _masked(-group["lr"], skip, 0.0, params[0])))
