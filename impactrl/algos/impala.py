"""IMPALA: the V-trace actor-critic loss (Espeholt et al. 2018, §4; docs/algorithms.md#impala-loss).

L = -Σ log π(a_t|x_t) · A_t  +  baseline_cost · ½ Σ (v_t - V(x_t))²  -  entropy_cost · Σ H(π(·|x_t))

summed over the T×B steps of the batch as in the paper, so RMSProp's ε and the gradient-norm
clip keep the paper's scale. v_t and A_t come from V-trace and are constants.
"""

from __future__ import annotations

import math

from impactrl.algos.base import Algorithm, LossExtras, LossResult
from impactrl.algos.common import loss_terms, online_pass, popart_targets, value_stats, vtrace_targets
from impactrl.data.rollout import Batch

# π/μ outside [1/10, 10]: the policies disagree, whatever ρ̄ clips (at ρ̄ = 1 half the steps are clipped on-policy).
EXTREME_LOG_RHO = math.log(10.0)


class Impala(Algorithm):
    loss_reduction = "sum"
    local_state_keys = ("pending",)

    def loss(self, batch: Batch) -> LossResult:
        c = self.config
        head = self.agent.policy_head
        output, policy, values, log_prob, bootstrap_value = online_pass(self.agent, batch)
        log_rhos = log_prob.detach() - batch["behaviour_log_prob"]
        vtrace = vtrace_targets(c, batch, log_rhos, values, bootstrap_value)
        loss_values, targets, advantages = loss_terms(self.agent, batch, output, vtrace)

        pg_loss = -(log_prob * advantages).sum()
        baseline_loss = 0.5 * (targets - loss_values).pow(2).sum()
        entropy = head.entropy(policy)
        loss = pg_loss + c.baseline_cost * baseline_loss - c.entropy_cost * entropy.sum()
        rhos = log_rhos.exp()
        clipped = (rhos > c.clip_rho_threshold).float().mean() if c.clip_rho_threshold is not None else rhos.new_zeros(())
        stats = {
            "loss/policy": pg_loss / log_prob.numel(),
            "loss/baseline": baseline_loss / log_prob.numel(),
            "loss/entropy": entropy.mean(),
            "vtrace/rho_mean": rhos.mean(),
            "vtrace/rho_clipped_fraction": clipped,
            "vtrace/rho_extreme_fraction": (log_rhos.abs() > EXTREME_LOG_RHO).float().mean(),
            **value_stats(values, vtrace),
        }
        return LossResult(loss, stats, LossExtras(value_targets=popart_targets(c, batch, vtrace)))
