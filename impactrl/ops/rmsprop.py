"""RMSProp in TensorFlow 1's form (docs/algorithms.md#rmsprop-tensorflows-form-and-pytorchs).

The IMPALA paper's hyperparameters are those of ``tf.train.RMSPropOptimizer``, which differs from
``torch.optim.RMSprop`` twice: ε sits under the square root, and the mean square starts at 1, so
the first steps are about ``lr · g`` instead of ``lr · sign(g)``. With the paper's ε = 0.01 the
smallest denominator is 0.1 here against 0.01 in PyTorch's form.
"""
from __future__ import annotations

import torch


class RMSpropTF(torch.optim.Optimizer):
    """ms ← ρ·ms + (1 − ρ)·g²  (ms₀ = 1);  mom ← μ·mom + lr·g / √(ms + ε);  θ ← θ − mom.

    As in TensorFlow the learning rate multiplies the gradient before the momentum, so a changed
    learning rate acts on new gradients only."""

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 0.01, momentum: float = 0.0):
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps, "momentum": momentum})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p]["square_avg"] = torch.ones_like(p, memory_format=torch.preserve_format)
                    if group["momentum"]:
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            grads = [p.grad for p in params]
            square_avgs = [self.state[p]["square_avg"] for p in params]
            torch._foreach_mul_(square_avgs, group["alpha"])
            torch._foreach_addcmul_(square_avgs, grads, grads, value=1.0 - group["alpha"])
            denominators = torch._foreach_add(square_avgs, group["eps"])
            torch._foreach_sqrt_(denominators)
            if group["momentum"]:
                buffers = [self.state[p]["momentum_buffer"] for p in params]
                torch._foreach_mul_(buffers, group["momentum"])
                torch._foreach_addcdiv_(buffers, grads, denominators, value=group["lr"])
                torch._foreach_sub_(params, buffers)
            else:
                torch._foreach_addcdiv_(params, grads, denominators, value=-group["lr"])
        return loss
