"""Synchronous PPO (Schulman et al. 2017, arXiv 1707.06347; docs/algorithms.md#ppo-loss), CleanRL's recipe.

All actors collect one unroll each with the same weights, then wait; the learner computes
GAE(λ) on the whole batch, takes ``update_epochs`` passes of ``num_minibatches`` shuffled
minibatches of single steps, and only then publishes the new weights. The batch's steps are
kept flat with the index chunks still to train on, so a checkpoint taken between two
minibatches holds exactly what remains.
"""

from __future__ import annotations

import torch

from impactrl.algos.base import Algorithm, LossExtras, LossResult
from impactrl.algos.common import agent_outputs, rewards_and_discounts
from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch
from impactrl.models import Agent, AgentInput
from impactrl.ops.gae import generalized_advantage_estimation
from impactrl.ops.policy_losses import ppo_clipped_surrogate, value_loss


class PPO(Algorithm):
    loss_reduction = "mean"
    local_state_keys = ("steps", "chunks")

    def __init__(self, config: TrainConfig, agent: Agent):
        super().__init__(config, agent)
        self.steps: Batch = {}  # the current batch's steps, flat [T * B, ...]
        self.chunks: list[torch.Tensor] = []  # indices of the minibatches still to train on, in order
        self.generator = torch.Generator().manual_seed(config.seed)

    def wants_data(self) -> bool:
        return not self.chunks

    def publish_now(self) -> bool:
        return not self.chunks

    @torch.no_grad()
    def add_batch(self, batch: Batch) -> None:
        c = self.config
        values = agent_outputs(self.agent, batch).value
        rewards, discounts = rewards_and_discounts(c, batch)
        gae = generalized_advantage_estimation(rewards, values[:-1], values[-1], discounts, c.gae_lambda)
        steps = {
            "obs": batch["obs"][:-1], "task": batch["task"][:-1], "action": batch["action"],
            "behaviour_log_prob": batch["behaviour_log_prob"], "advantages": gae.advantages,
            "returns": gae.returns, "old_values": values[:-1],
        }
        self.steps = {key: value.flatten(0, 1) for key, value in steps.items()}
        count = self.steps["advantages"].shape[0]
        for _ in range(c.update_epochs):
            order = torch.randperm(count, generator=self.generator).to(self.steps["advantages"].device)
            self.chunks.extend(order.tensor_split(c.num_minibatches))
        self.chunks.reverse()  # popped from the end

    def next_batch(self) -> Batch | None:
        if not self.chunks:
            return None
        chunk = self.chunks.pop()
        minibatch = {key: value[chunk] for key, value in self.steps.items()}
        if not self.chunks:
            self.steps = {}  # done with it: checkpoints don't carry it
        return minibatch

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "steps": self.steps, "chunks": list(self.chunks)}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        device = next(self.agent.parameters()).device
        self.steps = {key: value.to(device) for key, value in state["steps"].items()}
        self.chunks = [chunk.to(device) for chunk in state["chunks"]]

    def loss(self, minibatch: Batch) -> LossResult:
        c = self.config
        head = self.agent.policy_head
        obs = minibatch["obs"][None]
        size = obs.shape[1]
        inputs = AgentInput(obs, torch.zeros((1, size, *head.action_shape), dtype=head.action_dtype, device=obs.device),
                            torch.zeros((1, size), device=obs.device), torch.ones((1, size), dtype=torch.bool, device=obs.device),
                            minibatch["task"][None])
        output, _ = self.agent(inputs, ())
        policy, values = output.policy[0], output.value[0]
        log_prob = head.log_prob(policy, minibatch["action"])
        advantages = minibatch["advantages"]
        if c.normalize_advantages and advantages.numel() * self.group.size > 1:
            mean, std = self.group.mean_std(advantages)
            advantages = (advantages - mean) / (std + 1e-8)
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
        return LossResult(loss, stats, LossExtras())
