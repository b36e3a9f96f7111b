"""IMPACT (Luo et al. 2020, arXiv 1912.00167; docs/algorithms.md#impact-loss and the sections after it).

IMPALA plus three changes:

- a target network π_tgt, refreshed every ``target_update_period`` learner updates (hard copy,
  or Polyak with τ < 1); V-trace runs with log ρ = log π_tgt − log μ, λ inside the trace;
- the truncated IS ratio r_t(θ) = min(μ/π_tgt, ρ) · π_θ/μ in a clipped surrogate (ε);
- a circular buffer of N batches, each drawn K times, one SGD step per draw.

Losses are means over the batch (as RLlib and the author's code), unlike IMPALA's sums.
"""

from __future__ import annotations

import contextlib
import copy

import torch

from impactrl.algos.base import Algorithm, LossExtras, LossResult
from impactrl.algos.common import agent_outputs, loss_terms, online_pass, popart_targets, value_stats, vtrace_targets
from impactrl.config import TrainConfig
from impactrl.data.circular_buffer import CircularBuffer
from impactrl.data.rollout import Batch
from impactrl.models import Agent
from impactrl.ops.policy_losses import adaptive_kl_coefficient, impact_surrogate, value_loss


class _HeldBatch:
    """A batch in the circular buffer, with the target network's policy on it and the refresh
    count of the target that computed it."""

    __slots__ = ("batch", "target_policy", "scored_by")

    def __init__(self, batch: Batch):
        self.batch = batch
        self.target_policy: torch.Tensor | None = None
        self.scored_by = -1


class Impact(Algorithm):
    loss_reduction = "mean"
    local_state_keys = ("buffer",)

    def __init__(self, config: TrainConfig, agent: Agent):
        super().__init__(config, agent)
        self.target = copy.deepcopy(agent).requires_grad_(False) if config.use_target_network else None
        self.buffer = CircularBuffer(config.buffer_batches, config.buffer_uses, seed=config.seed)
        # β and the period's KL sum live on the learner's device: adapting β reads nothing back.
        device = next(agent.parameters()).device
        self.kl_coeff = torch.tensor(config.kl_coeff, device=device)
        self.kl_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.target_refreshes = 0
        self.updates_at_refresh = 0

    # --- the buffer ---------------------------------------------------------------------------
    def wants_data(self) -> bool:
        # "free": fetch only while a place is free, so no batch is evicted before its K uses and
        # actors wait when the learner is slower. "ready": wait only once the held batches are spent.
        if self.config.buffer_fetch == "ready":
            return len(self.buffer) == 0
        return len(self.buffer) < self.config.buffer_batches

    def takes_ready_data(self) -> bool:
        return self.config.buffer_fetch == "ready"

    def owes_updates(self) -> bool:
        return len(self.buffer) > 0  # uses left of held batches, also when a place is free

    def add_batch(self, batch: Batch) -> None:
        held = _HeldBatch(batch)
        if self.target is not None and self.config.target_scoring == "insert":
            self._score(held)
        self.buffer.add(held)

    def next_batch(self) -> Batch | None:
        held = self.buffer.sample()
        if held is None:
            return None
        if self.target is None:
            return held.batch
        # Scoring "at each use" means with the target network as it is at that use; a batch
        # drawn again before the next refresh gets the same scores, so they are kept (with
        # K = 20 and refreshes every 2·N·K updates, most uses skip the target's forward pass).
        # Insertion-scored batches were scored in add_batch; an unscored one has scored_by -1.
        if self.config.target_scoring == "use" and held.scored_by != self.target_refreshes:
            self._score(held)
        return {**held.batch, "target_policy": held.target_policy}

    # --- the target network -------------------------------------------------------------------
    @torch.no_grad()
    def target_policy(self, batch: Batch) -> torch.Tensor:
        return agent_outputs(self.target, batch).policy[:-1]

    def _score(self, held: _HeldBatch) -> None:
        held.target_policy = self.target_policy(held.batch)
        held.scored_by = self.target_refreshes

    @torch.no_grad()
    def refresh_target(self) -> None:
        tau = self.config.target_update_tau
        # Tensor by tensor rather than load_state_dict, which builds and matches a whole state
        # dict at every refresh.
        for target, online in zip(self.target.parameters(), self.agent.parameters()):
            if tau >= 1.0:
                target.copy_(online)
            else:
                target.lerp_(online, tau)
        for target, online in zip(self.target.buffers(), self.agent.buffers()):
            target.copy_(online)
        self.target_refreshes += 1

    def after_update(self, updates: int, extras: LossExtras, taken: torch.Tensor) -> dict[str, torch.Tensor | float]:
        stats = super().after_update(updates, extras, taken)
        if extras.kl is not None:
            self.kl_sum = self.kl_sum + torch.where(taken, extras.kl.detach().double(), 0.0)
        if self.target is not None and updates - self.updates_at_refresh >= self.config.effective_target_update_period:
            if self.config.use_kl_loss:
                # Once per target period, on the period's mean KL: adapting after every SGD step
                # halves β while π_θ is still close to a fresh target, and β = 0 never recovers.
                mean_kl = self.kl_sum / max(updates - self.updates_at_refresh, 1)
                self.kl_coeff = adaptive_kl_coefficient(self.kl_coeff, mean_kl, self.config.kl_target)
            self.kl_sum = torch.zeros_like(self.kl_sum)
            self.refresh_target()
            self.updates_at_refresh = updates
        buffer = self.buffer.stats()
        return {
            **stats,
            "impact/target_refreshes": self.target_refreshes,
            "impact/kl_coeff": self.kl_coeff,
            "buffer/batches_held": buffer["held_batches"],
            "buffer/uses_left": buffer["uses_left"],
            "buffer/sgd_steps_per_batch": buffer["total_draws"] / max(buffer["total_added"], 1),
            "buffer/evicted_unused_uses": buffer["evicted_unused_uses"],
        }

    # --- the loss -----------------------------------------------------------------------------
    def loss(self, batch: Batch) -> LossResult:
        c = self.config
        head = self.agent.policy_head
        output, policy, values, log_prob, bootstrap_value = online_pass(self.agent, batch)
        behaviour_log_prob = batch["behaviour_log_prob"]
        if self.target is None:
            target_policy, target_log_prob = None, behaviour_log_prob
        else:
            target_policy = batch["target_policy"] if "target_policy" in batch else self.target_policy(batch)
            target_log_prob = head.log_prob(target_policy, batch["action"])

        vtrace = vtrace_targets(c, batch, target_log_prob - behaviour_log_prob, values, bootstrap_value)
        loss_values, targets, advantages = loss_terms(self.agent, batch, output, vtrace)
        if c.normalize_advantages:
            mean, std = self.group.mean_std(advantages)
            advantages = (advantages - mean) / (std + 1e-8)
        surrogate, surrogate_stats = impact_surrogate(
            log_prob, target_log_prob, behaviour_log_prob, advantages, c.clip_param, c.target_worker_clip)
        baseline_loss = value_loss(loss_values, targets)
        entropy = head.entropy(policy).mean()
        loss = surrogate + c.baseline_cost * baseline_loss - c.entropy_cost * entropy
        stats: dict = {f"impact/{key}": value for key, value in surrogate_stats.items()}
        if target_policy is not None:
            # Without the KL loss it is only a statistic: no graph (and never grad turned on
            # inside a caller's no_grad, which set_grad_enabled(True) would do).
            with contextlib.nullcontext() if c.use_kl_loss else torch.no_grad():
                kl = head.kl(target_policy, policy).mean()
            if c.use_kl_loss:
                loss = loss + self.kl_coeff * kl
            stats["impact/kl_target_online"] = kl
        stats.update({
            "loss/policy": surrogate,
            "loss/baseline": baseline_loss,
            "loss/entropy": entropy,
            **value_stats(values, vtrace),
        })
        return LossResult(loss, stats, LossExtras(
            value_targets=popart_targets(c, batch, vtrace),
            kl=stats["impact/kl_target_online"] if target_policy is not None else None))

    def state_dict(self) -> dict:
        return {
            "target": self.target.state_dict() if self.target is not None else None,
            "kl_coeff": float(self.kl_coeff),
            "kl_sum": float(self.kl_sum),
            "target_refreshes": self.target_refreshes,
            "updates_at_refresh": self.updates_at_refresh,
            "buffer": self.buffer.state_dict(lambda held: {"batch": held.batch, "target_policy": held.target_policy,
                                                           "scored_by": held.scored_by}),
        }

    def load_state_dict(self, state: dict) -> None:
        if self.target is not None:
            self.target.load_state_dict(state["target"])
        self.kl_coeff.fill_(state["kl_coeff"])
        self.kl_sum.fill_(state["kl_sum"])
        self.target_refreshes = state["target_refreshes"]
        self.updates_at_refresh = state["updates_at_refresh"]
        self.buffer.load_state_dict(state["buffer"], self._held_from_state)

    def _held_from_state(self, state: dict) -> _HeldBatch:
        device = next(self.agent.parameters()).device
        held = _HeldBatch({key: value.to(device) for key, value in state["batch"].items()})
        if state["target_policy"] is not None:
            held.target_policy = state["target_policy"].to(device)
        held.scored_by = state["scored_by"]
        return held
