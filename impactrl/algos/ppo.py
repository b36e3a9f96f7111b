"""Synchronous PPO (Schulman et al. 2017, arXiv 1707.06347; ALGORITHMS.md §d), CleanRL's recipe.

All actors collect one unroll each with the same weights, then wait; the learner computes
GAE(λ) on the whole batch, takes ``update_epochs`` passes of ``num_minibatches`` shuffled
minibatches of single steps, and only then publishes the new weights.
"""

from __future__ import annotations

from collections import deque

import torch

from impactrl.algos.base import Algorithm, to_floats
from impactrl.algos.common import agent_outputs, rewards_and_discounts
from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch
from impactrl.models import Agent, AgentInput
from impactrl.ops.gae import generalized_advantage_estimation
from impactrl.ops.policy_losses import ppo_clipped_surrogate, value_loss

# Per-step fields a minibatch carries (the recurrent inputs are not needed without a core).
STEP_KEYS = ("obs", "action", "behaviour_log_prob", "advantages", "returns", "old_values")


class PPO(Algorithm):
    def __init__(self, config: TrainConfig, agent: Agent):
        super().__init__(config, agent)
        self.minibatches: deque[Batch] = deque()
        self.generator = torch.Generator().manual_seed(config.seed)

    def wants_data(self) -> bool:
        return not self.minibatches

    def publish_now(self) -> bool:
        return not self.minibatches

    @torch.no_grad()
    def add_batch(self, batch: Batch) -> None:
        c = self.config
        values = agent_outputs(self.agent, batch).value
        rewards, discounts, trace_discounts = rewards_and_discounts(c, batch)
        gae = generalized_advantage_estimation(rewards, values[:-1], values[-1], discounts, c.gae_lambda,
                                               trace_discounts=trace_discounts)
        steps = {
            "obs": batch["obs"][:-1], "action": batch["action"],
            "behaviour_log_prob": batch["behaviour_log_prob"], "advantages": gae.advantages,
            "returns": gae.returns, "old_values": values[:-1],
        }
        flat = {key: value.flatten(0, 1) for key, value in steps.items()}
        count = flat["advantages"].shape[0]
        for _ in range(c.update_epochs):
            order = torch.randperm(count, generator=self.generator).to(flat["advantages"].device)
            for chunk in order.tensor_split(c.num_minibatches):
                self.minibatches.append({key: value[chunk] for key, value in flat.items()})

    def next_batch(self) -> Batch | None:
        return self.minibatches.popleft() if self.minibatches else None

    def loss(self, minibatch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        c = self.config
        head = self.agent.policy_head
        obs = minibatch["obs"][None]
        size = obs.shape[1]
        inputs = AgentInput(obs, torch.zeros((1, size, *head.action_shape), dtype=head.action_dtype, device=obs.device),
                            torch.zeros((1, size), device=obs.device), torch.ones((1, size), dtype=torch.bool, device=obs.device))
        output, _ = self.agent(inputs, ())
        policy, values = output.policy[0], output.value[0]
        log_prob = head.log_prob(policy, minibatch["action"])
        advantages = minibatch["advantages"]
        if c.normalize_advantages and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy_loss, clip_fraction = ppo_clipped_surrogate(log_prob, minibatch["behaviour_log_prob"], advantages,
                                                           c.clip_param)
        baseline_loss = value_loss(values, minibatch["returns"], minibatch["old_values"],
                                   c.clip_param if c.clip_value_loss else None)
        entropy = head.entropy(policy).mean()
        loss = policy_loss + c.baseline_cost * baseline_loss - c.entropy_cost * entropy
        log_ratio = log_prob.detach() - minibatch["behaviour_log_prob"]
        stats = {
            "loss/policy": policy_loss,
            "loss/baseline": baseline_loss,
            "loss/entropy": entropy,
            "ppo/clip_fraction": clip_fraction,
            "ppo/approx_kl": ((log_ratio.exp() - 1) - log_ratio).mean(),
            "value/mean": values.mean(),
            "value/target_mean": minibatch["returns"].mean(),
        }
        return loss, to_floats(stats)
