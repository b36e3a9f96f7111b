"""Pieces the losses share: running the agent over a batch, rewards and discounts, V-trace."""

from __future__ import annotations

import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch, core_state
from impactrl.models import Agent, AgentInput, AgentOutput
from impactrl.ops.returns import bootstrap_truncations
from impactrl.ops.vtrace import VTraceReturns, vtrace_from_importance_weights


def agent_outputs(agent: Agent, batch: Batch) -> AgentOutput:
    """The agent over a batch's T+1 observations, its LSTM starting from the actors' state."""
    inputs = AgentInput(batch["obs"], batch["prev_action"], batch["prev_reward"], batch["first"], batch["task"])
    output, _ = agent(inputs, core_state(batch))
    return output


def rewards_and_discounts(config: TrainConfig, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Transformed rewards with truncations bootstrapped, and the discounts (0 at episode ends)."""
    rewards = batch["reward"].clamp(-1.0, 1.0) if config.reward_clip == "abs_one" else batch["reward"]
    return bootstrap_truncations(rewards, batch["terminated"], batch["truncated"], batch["truncation_value"],
                                 config.discount)


def vtrace_targets(config: TrainConfig, batch: Batch, log_rhos: torch.Tensor, values: torch.Tensor,
                   bootstrap_value: torch.Tensor) -> VTraceReturns:
    """V-trace value targets and advantages for a batch, with the config's ρ̄, ρ̄_pg, c̄ and λ."""
    rewards, discounts = rewards_and_discounts(config, batch)
    return vtrace_from_importance_weights(
        log_rhos, discounts, rewards, values.detach(), bootstrap_value.detach(),
        clip_rho_threshold=config.clip_rho_threshold, clip_pg_rho_threshold=config.clip_pg_rho_threshold,
        clip_c_threshold=config.clip_c_threshold, lambda_=config.vtrace_lambda)


def loss_terms(agent: Agent, batch: Batch, output: AgentOutput, vtrace: VTraceReturns) -> tuple[torch.Tensor, ...]:
    """``(values, value targets, policy-gradient advantages)`` for the losses: as V-trace gives them,
    or with PopArt in the task's normalised space (docs/algorithms.md#popart): the learner's n(x), the
    targets (v − μ) / σ and the advantages divided by σ (V-trace itself ran on unnormalised values)."""
    values = output.value[:-1]
    if output.normalized_value is None:
        return values, vtrace.vs, vtrace.pg_advantages
    mu, sigma = agent.value_head.statistics(batch["task"][:-1], values.shape)
    return output.normalized_value[:-1], (vtrace.vs - mu) / sigma, vtrace.pg_advantages / sigma
