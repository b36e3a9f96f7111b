"""Pieces the losses share: running the agent over a batch, rewards and discounts, V-trace."""

from __future__ import annotations

from typing import NamedTuple

import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch, core_state
from impactrl.models import Agent, AgentInput, AgentOutput
from impactrl.ops.returns import bootstrap_truncations, explained_variance
from impactrl.ops.vtrace import VTraceReturns, vtrace_from_importance_weights


def agent_outputs(agent: Agent, batch: Batch) -> AgentOutput:
    """The agent over a batch's T+1 observations, its LSTM starting from the actors' state."""
    inputs = AgentInput(batch["obs"], batch["prev_action"], batch["prev_reward"], batch["first"], batch["task"])
    output, _ = agent(inputs, core_state(batch))
    return output


class OnlinePass(NamedTuple):
    """The learner's agent over a batch: its output; at x_0 … x_{T−1} the policy, V(x_t) and
    log π_θ(a_t|x_t); and V(x_T)."""

    output: AgentOutput
    policy: torch.Tensor
    values: torch.Tensor
    log_prob: torch.Tensor
    bootstrap_value: torch.Tensor


def online_pass(agent: Agent, batch: Batch) -> OnlinePass:
    output = agent_outputs(agent, batch)
    policy = output.policy[:-1]
    return OnlinePass(output, policy, output.value[:-1], agent.policy_head.log_prob(policy, batch["action"]),
                      output.value[-1])


def value_stats(values: torch.Tensor, vtrace: VTraceReturns) -> dict[str, torch.Tensor]:
    """How V(x_t) compares with its V-trace targets, for the metrics."""
    return {"value/mean": values.mean(), "value/target_mean": vtrace.vs.mean(),
            "value/explained_variance": explained_variance(values, vtrace.vs)}


def popart_targets(config: TrainConfig, batch: Batch, vtrace: VTraceReturns) -> tuple[torch.Tensor, ...] | None:
    """With PopArt, the V-trace targets and their tasks, which the statistics move to after the update."""
    return (vtrace.vs, batch["task"][:-1]) if config.popart else None


def rewards_and_discounts(config: TrainConfig, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformed rewards with truncations bootstrapped, and the discounts (0 at episode ends)."""
    rewards = batch["reward"].clamp(-1.0, 1.0) if config.reward_clip == "abs_one" else batch["reward"]
    return bootstrap_truncations(rewards, batch["terminated"], batch["truncated"], batch["truncation_value"],
                                 config.discount)


def vtrace_targets(config: TrainConfig, batch: Batch, log_rhos: torch.Tensor, values: torch.Tensor,
                   bootstrap_value: torch.Tensor) -> VTraceReturns:
    """V-trace value targets and advantages for a batch, with the config's ρ̄, ρ̄_pg, c̄ and λ; without
    the correction, π/μ = 1 (n-step returns and the plain actor-critic advantage)."""
    rewards, discounts = rewards_and_discounts(config, batch)
    corrected = config.off_policy_correction == "vtrace"
    return vtrace_from_importance_weights(
        log_rhos if corrected else torch.zeros_like(log_rhos), discounts, rewards, values.detach(),
        bootstrap_value.detach(), clip_rho_threshold=config.clip_rho_threshold if corrected else None,
        clip_pg_rho_threshold=config.clip_pg_rho_threshold if corrected else None,
        clip_c_threshold=config.clip_c_threshold if corrected else None, lambda_=config.vtrace_lambda)


def loss_terms(agent: Agent, batch: Batch, output: AgentOutput, vtrace: VTraceReturns) -> tuple[torch.Tensor, ...]:
    """``(values, value targets, policy-gradient advantages)`` for the losses: as V-trace gives them,
    or with PopArt in the task's normalised space (docs/algorithms.md#popart): the learner's n(x), the
    targets (v − μ) / σ and the advantages divided by σ (V-trace itself ran on unnormalised values)."""
    values = output.value[:-1]
    if output.normalized_value is None:
        return values, vtrace.vs, vtrace.pg_advantages
    mu, sigma = agent.value_head.statistics(batch["task"][:-1], values.shape)
    return output.normalized_value[:-1], (vtrace.vs - mu) / sigma, vtrace.pg_advantages / sigma
