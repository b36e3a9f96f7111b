"""Algorithms on real batches from a real actor: IMPACT's target cadence, buffer use, gradients."""

import dataclasses

import pytest
import torch

from conftest import collect

from impactrl.algos import make_algorithm
from impactrl.config import TrainConfig
from impactrl.training import build_learner

IMPACT = TrainConfig(algo="impact", env="CartPole-v1", envs_per_actor=4, unrolls_per_batch=4, unroll_length=10,
                     optimizer="adam", learning_rate=1e-3, buffer_batches=2, buffer_uses=3,
                     normalize_advantages=False)


def test_impact_takes_k_steps_per_batch_and_refreshes_target_on_cadence():
    learner, batches = collect(IMPACT, slots=6)
    algorithm = learner.algorithm
    assert IMPACT.effective_target_update_period == 2 * 2 * 3
    updates = 0
    refreshes_seen = []
    for batch in batches:
        while not algorithm.wants_data():
            stats = learner.update()
            assert stats is not None
            updates += 1
            refreshes_seen.append(stats["impact/target_refreshes"])
        learner.add(batch)
    while (stats := learner.update()) is not None:
        updates += 1
        refreshes_seen.append(stats["impact/target_refreshes"])
    assert updates == 6 * 3  # every batch drawn exactly K times
    assert algorithm.buffer.evicted_unused_uses == 0
    assert refreshes_seen[11] == 1 and refreshes_seen[10] == 0  # after update 12 = 2·N·K
    assert refreshes_seen[-1] == 1  # 18 updates: the next refresh is due at 24


def test_impact_fetching_ready_batches_trains_on_held_ones_and_evicts_the_oldest():
    """--buffer-fetch ready: the learner waits only once every held batch is spent, and a batch
    taken while N are held evicts the oldest with the uses it had left."""
    learner, batches = collect(dataclasses.replace(IMPACT, buffer_fetch="ready"), slots=3)
    algorithm = learner.algorithm
    assert algorithm.wants_data() and algorithm.takes_ready_data()
    learner.add(batches[0])
    assert not algorithm.wants_data()  # K = 3 uses held: train on them while no batch is ready
    assert learner.update() is not None
    learner.add(batches[1])
    learner.add(batches[2])  # N = 2 were held: the oldest goes with its 2 uses left
    assert algorithm.buffer.evicted_unused_uses == 2
    updates = 0
    while not algorithm.wants_data():
        assert learner.update() is not None
        updates += 1
    assert updates == 2 * 3 and learner.update() is None


def test_hard_refresh_copies_weights_exactly_and_polyak_moves_by_tau():
    learner, batches = collect(IMPACT, slots=1)
    algorithm = learner.algorithm
    learner.add(batches[0])
    learner.update()
    assert any(not torch.equal(t, o) for t, o in zip(algorithm.target.parameters(), learner.agent.parameters()))
    algorithm.refresh_target()
    assert all(torch.equal(t, o) for t, o in zip(algorithm.target.parameters(), learner.agent.parameters()))
    polyak_learner, _ = collect(dataclasses.replace(IMPACT, target_update_tau=0.25), slots=1)
    polyak = polyak_learner.algorithm
    before = [p.clone() for p in polyak.target.parameters()]
    with torch.no_grad():
        for p in polyak_learner.agent.parameters():
            p.add_(1.0)
    polyak.refresh_target()
    for old, new, online in zip(before, polyak.target.parameters(), polyak_learner.agent.parameters()):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * online)


@pytest.mark.parametrize("scoring", ["use", "insert"])
def test_target_scores_come_from_the_target_the_scoring_mode_names(scoring):
    """Scoring at each use gives the current target's policy at every draw (kept between
    refreshes, not recomputed); at insertion, the policy of the target when the batch went in."""
    learner, batches = collect(dataclasses.replace(IMPACT, buffer_batches=1, target_scoring=scoring), slots=1)
    algorithm = learner.algorithm
    algorithm.add_batch(batches[0])
    at_insert = algorithm.target_policy(batches[0])
    first = algorithm.next_batch()["target_policy"]
    assert algorithm.next_batch()["target_policy"] is first  # same target: no second forward pass
    torch.testing.assert_close(first, at_insert, rtol=0, atol=0)
    with torch.no_grad():
        for p in learner.agent.parameters():
            p.add_(0.05 * torch.randn_like(p))
    algorithm.refresh_target()
    third = algorithm.next_batch()["target_policy"]
    refreshed = algorithm.target_policy(batches[0])
    assert not torch.equal(refreshed, at_insert)
    torch.testing.assert_close(third, refreshed if scoring == "use" else at_insert, rtol=0, atol=0)


@pytest.mark.parametrize("scoring", ["use", "insert"])
def test_impact_gradients_reach_only_the_online_network(scoring):
    config = dataclasses.replace(IMPACT, target_scoring=scoring, use_kl_loss=True)
    learner, batches = collect(config, slots=1)
    algorithm = learner.algorithm
    algorithm.add_batch(batches[0])
    loss = algorithm.loss(algorithm.next_batch()).loss
    loss.backward()
    assert all(p.grad is None for p in algorithm.target.parameters())
    assert all(p.grad is not None for p in learner.agent.parameters())


def test_impact_loss_matches_a_hand_composition():
    """The loss is exactly the ops composed as docs/algorithms.md#impact-loss writes them."""
    from impactrl.algos.common import agent_outputs
    from impactrl.ops.policy_losses import impact_surrogate, value_loss
    from impactrl.ops.returns import bootstrap_truncations
    from impactrl.ops.vtrace import vtrace_from_importance_weights

    config = dataclasses.replace(IMPACT, entropy_cost=0.01, baseline_cost=0.5)
    learner, batches = collect(config, slots=1)
    algorithm, batch, head = learner.algorithm, batches[0], learner.agent.policy_head
    with torch.no_grad():
        for p in learner.agent.parameters():  # make online and target differ
            p.add_(0.05 * torch.randn_like(p))
        loss = algorithm.loss(batch).loss
        out = agent_outputs(learner.agent, batch)
        tgt = agent_outputs(algorithm.target, batch)
        logp = head.log_prob(out.policy[:-1], batch["action"])
        tlogp = head.log_prob(tgt.policy[:-1], batch["action"])
        mu = batch["behaviour_log_prob"]
        r, d = bootstrap_truncations(batch["reward"], batch["terminated"], batch["truncated"],
                                         batch["truncation_value"], config.discount)
        vt = vtrace_from_importance_weights(tlogp - mu, d, r, out.value[:-1], out.value[-1])
        ratio = torch.exp(logp - mu) * torch.clamp(torch.exp(mu - tlogp), max=2.0)
        surrogate = -torch.min(ratio * vt.pg_advantages, ratio.clamp(0.6, 1.4) * vt.pg_advantages).mean()
        expected = (surrogate + 0.5 * 0.5 * (vt.vs - out.value[:-1]).pow(2).mean()
                    - 0.01 * head.entropy(out.policy[:-1]).mean())
    torch.testing.assert_close(loss, expected)
    reference_surrogate, _ = impact_surrogate(logp, tlogp, mu, vt.pg_advantages, 0.4, 2.0)
    torch.testing.assert_close(reference_surrogate, surrogate)
    torch.testing.assert_close(value_loss(out.value[:-1], vt.vs), 0.5 * (vt.vs - out.value[:-1]).pow(2).mean())


def test_impact_with_lstm_and_episode_ends_trains_with_k_above_one():
    """RLlib issue #8616: recurrent APPO with several SGD passes crashed on episode ends."""
    config = dataclasses.replace(IMPACT, env="impactrl/CartPoleNoVelocity-v1", use_lstm=True, lstm_size=16,
                                 unroll_length=40, buffer_batches=2, buffer_uses=4)
    learner, batches = collect(config, slots=3)
    assert any(batch["first"][1:].any() for batch in batches), "want an episode start inside an unroll"
    for batch in batches:
        learner.add(batch)
        while learner.update() is not None:
            pass
    assert learner.counters.updates == 3 * 4


def test_ppo_minibatches_cover_the_batch_each_epoch_and_publish_at_the_end():
    config = TrainConfig(algo="ppo", env="CartPole-v1", num_actors=1, envs_per_actor=4, unrolls_per_batch=4,
                         unroll_length=16, update_epochs=3, num_minibatches=4, optimizer="adam")
    learner, batches = collect(config, slots=1)
    algorithm = learner.algorithm
    learner.add(batches[0])
    published = []
    while learner.update() is not None:
        published.append(algorithm.publish_now())
    assert len(published) == 3 * 4 and published[-1] and not any(published[:-1])
    assert algorithm.wants_data()


def test_make_algorithm_knows_every_algo():
    for algo in ("impala", "impact", "ppo"):
        learner, _ = collect(TrainConfig(algo=algo, env="CartPole-v1", num_actors=1, envs_per_actor=2,
                                         unrolls_per_batch=2, unroll_length=4, num_minibatches=2), slots=0)
        assert type(make_algorithm(learner.config, learner.agent)).__name__.lower() == algo


def test_observation_statistics_move_after_the_batch_is_used_and_ppo_starts_at_ratio_one():
    config = TrainConfig(algo="ppo", env="Pendulum-v1", num_actors=1, envs_per_actor=2, unrolls_per_batch=2,
                         unroll_length=32, update_epochs=2, num_minibatches=2, optimizer="adam",
                         normalize_observations=True, separate_value_network=True)
    learner, batches = collect(config, slots=1)
    norm = learner.agent.obs_norm
    learner.add(batches[0])
    count_before = norm.count.clone()
    stats = learner.update()
    assert stats["ppo/approx_kl"] == 0.0 and stats["ppo/clip_fraction"] == 0.0  # same weights, same statistics
    assert torch.equal(norm.count, count_before)
    while learner.update() is not None:
        pass
    assert norm.count.item() == pytest.approx(count_before.item() + 2 * 32)


def test_a_learner_that_does_not_learn_keeps_no_observations():
    """impactrl bench --no-learning: batches keep coming and nothing piles up for the statistics."""
    config = TrainConfig(algo="impala", env="CartPole-v1", num_actors=1, envs_per_actor=2, unrolls_per_batch=2,
                         unroll_length=8, normalize_observations=True)
    learner, batches = collect(config, slots=1)
    learner.learn = False
    count_before = learner.agent.obs_norm.count.clone()
    for _ in range(3):
        learner.add(batches[0])
        assert learner.update() == {}
    assert not learner._unseen_obs and torch.equal(learner.agent.obs_norm.count, count_before)


def test_kl_coefficient_adapts_once_per_target_period():
    config = dataclasses.replace(IMPACT, use_kl_loss=True, kl_coeff=1.0, kl_target=1e-9, buffer_batches=1,
                                 buffer_uses=2, target_update_period=3)
    learner, batches = collect(config, slots=3)
    coefficients = []
    for batch in batches:
        learner.add(batch)
        while (stats := learner.update()) is not None:
            coefficients.append(stats["impact/kl_coeff"])
    # KL far above 2 * target: beta grows by 1.5 at each refresh (updates 3 and 6), not at every step.
    assert coefficients == [1.0, 1.0, 1.5, 1.5, 1.5, 2.25]


@pytest.mark.parametrize("algo", ["impala", "impact", "ppo"])
def test_bfloat16_learner_keeps_float32_weights_and_losses_and_tracks_float32(algo):
    config = dataclasses.replace(IMPACT, algo=algo, env="MinAtar/Breakout-v1", lr_decay=False, num_minibatches=2,
                                 update_epochs=1)
    learner, batches = collect(config, slots=1)
    low = build_learner(dataclasses.replace(config, learner_precision="bfloat16"), None)[0]
    low.agent.load_state_dict(learner.agent.state_dict())
    for each in (learner, low):
        each.add(batches[0])
    full_stats, low_stats = learner.update(), low.update()
    assert all(p.dtype == torch.float32 and p.grad is not None for p in low.agent.parameters())
    # The same step in bfloat16 moves the weights like the float32 step, to bfloat16's precision.
    for full, reduced in zip(learner.agent.parameters(), low.agent.parameters()):
        torch.testing.assert_close(reduced, full, atol=2e-3, rtol=0.0)
    for key in ("loss/policy", "loss/baseline", "loss/entropy"):
        assert abs(low_stats[key] - full_stats[key]) <= 0.02 * abs(full_stats[key]) + 1e-3, key


def test_a_skipped_update_leaves_neither_its_kl_nor_its_value_targets_behind():
    """An update whose loss is not finite is skipped on the device (Learner.update): its KL does
    not count towards the target period's mean KL, PopArt's statistics do not move to its targets,
    and the skips are counted when the learner reads them (at a metrics line)."""
    config = dataclasses.replace(IMPACT, popart=True, use_kl_loss=True, buffer_batches=1, buffer_uses=3)
    learner, batches = collect(config, slots=2)
    algorithm, head = learner.algorithm, learner.agent.value_head
    with torch.no_grad():
        for p in learner.agent.parameters():  # online and target differ: a KL above 0
            p.add_(0.05 * torch.randn_like(p))
    statistics = [tensor.clone() for tensor in head.buffers()]
    learner.add({**batches[0], "reward": torch.full_like(batches[0]["reward"], float("nan"))})
    weights = [p.detach().clone() for p in learner.agent.parameters()]
    for _ in range(config.buffer_uses):
        learner.update()
        assert not learner.taken
    learner.skips.read(learner.counters)
    assert learner.counters.updates_skipped == 3 and learner.skips.in_a_row == 3 and learner.counters.updates == 3
    assert all(torch.equal(before, after) for before, after in zip(weights, learner.agent.parameters()))
    assert algorithm.kl_sum == 0.0
    assert all(torch.equal(before, after) for before, after in zip(statistics, head.buffers()))
    learner.add(batches[1])
    stats = learner.update()
    assert stats["impact/kl_target_online"] > 0.0
    assert algorithm.kl_sum == stats["impact/kl_target_online"]  # this update's KL only
    assert any(not torch.equal(before, after) for before, after in zip(statistics, head.buffers()))


def test_impala_without_correction_trains_on_n_step_returns_whatever_the_lag():
    """--off-policy-correction none: value targets are the discounted n-step returns and the advantage
    r_t + γ v_{t+1} − V(x_t), as if the stale actor's data were on-policy, whatever ρ̄ (float64 reference loop)."""
    from impactrl.algos.common import agent_outputs
    from impactrl.ops.returns import bootstrap_truncations

    config = TrainConfig(algo="impala", env="CartPole-v1", envs_per_actor=4, unrolls_per_batch=1, unroll_length=10,
                         off_policy_correction="none", clip_rho_threshold=0.5, entropy_cost=0.01,
                         baseline_cost=0.5)
    learner, batches = collect(config, slots=1)
    algorithm, batch, head = learner.algorithm, batches[0], learner.agent.policy_head
    with torch.no_grad():
        for p in learner.agent.parameters():  # the learner has moved on from the actor's policy
            p.add_(0.05 * torch.randn_like(p))
        loss = algorithm.loss(batch).loss
        out = agent_outputs(learner.agent, batch)
        logp = head.log_prob(out.policy[:-1], batch["action"])
        assert (logp - batch["behaviour_log_prob"]).abs().max() > 1e-3
        r, d = bootstrap_truncations(batch["reward"], batch["terminated"], batch["truncated"],
                                     batch["truncation_value"], config.discount)
    r, d, v = r.double(), d.double(), out.value.double()
    targets = torch.empty_like(r)
    following = v[-1]
    for t in reversed(range(r.shape[0])):
        following = r[t] + d[t] * following
        targets[t] = following
    next_targets = torch.cat([targets[1:], v[-1:]])
    advantages = r + d * next_targets - v[:-1]
    expected = (-(logp.double() * advantages).sum() + 0.5 * 0.5 * (targets - v[:-1]).pow(2).sum()
                - 0.01 * head.entropy(out.policy[:-1]).double().sum())
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-4)
