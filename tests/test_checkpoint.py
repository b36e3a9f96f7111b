"""Exact resume: a checkpoint restores every component of the learner's state, and a restored
learner then takes exactly the steps the original takes (bit for bit, on the CPU)."""

import os
import shutil
import time

import pytest
import torch

from impactrl.checkpoint import load_checkpoint, restore_rng_states, rng_states, save_checkpoint
from impactrl.config import TrainConfig
from impactrl.data.rollout import SlotStore
from impactrl.runtime.actor import Actor
from impactrl.training import build_learner

CONFIGS = {
    # IMPACT with a buffer of 2 batches used 3 times, the adaptive KL, and both normalisers.
    "impact": TrainConfig(algo="impact", env="CartPole-v1", num_actors=2, envs_per_actor=4, unrolls_per_batch=4,
                          unroll_length=10, buffer_batches=2, buffer_uses=3, optimizer="adam", use_kl_loss=True,
                          normalize_observations=True, normalize_rewards=True),
    # PPO stopped between two minibatches of its second epoch.
    "ppo": TrainConfig(algo="ppo", env="CartPole-v1", num_actors=1, envs_per_actor=4, unrolls_per_batch=4,
                       unroll_length=16, update_epochs=2, num_minibatches=4, normalize_observations=True,
                       normalize_rewards=True),
    # IMPALA with an LSTM core.
    "impala": TrainConfig(algo="impala", env="CartPole-v1", num_actors=1, envs_per_actor=4, unrolls_per_batch=4,
                          unroll_length=10, use_lstm=True, lstm_size=32),
}


def unrolls(config: TrainConfig, learner, spec, count: int):
    """``count`` batches with their metadata, written by real actors with the learner's weights."""
    actors = [Actor(config, actor_id=i) for i in range(config.num_actors)]
    store = SlotStore(spec, num_slots=count, shared=False)
    for slot in range(count):
        actor = actors[slot % len(actors)]
        actor.agent.load_state_dict(learner.agent.state_dict())
        actor.unroll(store.slot_arrays(slot))
        store.record(slot, actor.record(policy_version=0), created_at=time.time())
    for actor in actors:
        actor.close()
    return [store.assemble([slot]) for slot in range(count)]


def feed(learner, items, extra_updates: int) -> None:
    """Train on ``items`` as the learner loop does, then ``extra_updates`` more SGD steps."""
    for batch, meta in items:
        while not learner.algorithm.wants_data():
            assert learner.update() is not None
        learner.record_unrolls(meta)
        learner.add(batch)
    for _ in range(extra_updates):
        if learner.update() is None:  # it needs fresh data first
            break


def assert_same(a, b, path="state") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b) or (a.is_floating_point() and torch.equal(a.isnan(), b.isnan())
                                     and torch.equal(a.nan_to_num(), b.nan_to_num())), path
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys {sorted(set(a) ^ set(b))}"
        for key in a:
            assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_restored_learner_equals_the_saved_one_and_trains_identically(name, tmp_path):
    config = CONFIGS[name]
    original, spec = build_learner(config, None)
    items = unrolls(config, original, spec, count=6)
    feed(original, items[:3], extra_updates=1 if name != "impala" else 0)
    if name == "impact":
        assert len(original.algorithm.buffer) == 2 and original.algorithm.buffer.uses_left > 0
        assert not torch.isnan(original.reward_stats).all() and original.agent.obs_norm.count > 1
    if name == "ppo":
        assert 0 < len(original.algorithm.chunks) < 8

    save_checkpoint(tmp_path, original.state_dict(), "ckpt_x", keep=3)
    saved = load_checkpoint(tmp_path)  # weights_only, checksum verified
    rng = rng_states()
    torch.manual_seed(12345)  # a fresh process would have another RNG state; the checkpoint restores it
    restored, _ = build_learner(config, saved)

    # Component by component: the restored state is the state that was saved.
    assert_same(saved, restored.state_dict())
    assert_same({k: v for k, v in original.state_dict().items() if k != "rng"},
                {k: v for k, v in restored.state_dict().items() if k != "rng"})

    # Both go on with the same data from the same RNG state: every step is the same.
    for learner in (original, restored):
        restore_rng_states(rng)
        feed(learner, items[3:], extra_updates=2)
    assert original.counters.updates == restored.counters.updates
    assert_same({k: v for k, v in original.state_dict().items() if k != "rng"},
                {k: v for k, v in restored.state_dict().items() if k != "rng"})


def test_a_copied_run_directory_loads_the_checkpoint_it_stopped_at(tmp_path):
    """Copies reset modification times (cp -r, scp, an upload), by which the newest is found
    otherwise: latest.pt still names it, or is a copy of it when the copy followed links."""
    run = tmp_path / "run"
    run.mkdir()  # save_checkpoint never creates a run directory
    for updates in (10, 20, 30):
        state = {key: updates for key in ("agent", "optimizer", "algorithm", "rng", "config")}
        save_checkpoint(run, {**state, "learner": {"updates": updates}}, f"ckpt_{updates:010d}", keep=3)
    for links, copy in ((True, tmp_path / "cp-r"), (False, tmp_path / "scp")):
        shutil.copytree(run, copy, symlinks=links)
        files = sorted((copy / "checkpoints").glob("ckpt_*.pt"))
        for age, path in enumerate(files):  # the oldest checkpoint now looks the newest
            os.utime(path, ns=(10**18 - age * 10**12,) * 2)
        assert load_checkpoint(copy)["learner"]["updates"] == 30


@pytest.mark.slow  # trains with real actor processes
def test_milestone_checkpoints_outlive_the_rotation_and_evaluate(run_dir):
    from conftest import FAST, run_cli

    run_cli("train", "--env", "CartPole-v1", *FAST, "--total-env-steps", "24000", "--milestone-env-steps", "8000",
            "--keep-checkpoints", "1", "--out", str(run_dir), "--quiet", check=True)
    kept = sorted(path.name for path in (run_dir / "checkpoints").glob("steps_*.pt"))
    assert kept == ["steps_000000008000.pt", "steps_000000016000.pt", "steps_000000024000.pt"]
    first = load_checkpoint(run_dir / "checkpoints" / kept[0])
    assert 8000 <= first["learner"]["env_steps"] < 16000
    result = run_cli("eval", str(run_dir / "checkpoints" / kept[0]), "--episodes", "2", check=True)
    assert '"env_steps_trained"' in result.stdout
