"""The local runtime with real processes: slot layout, backpressure, metrics, resume, actor death."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import yaml

from conftest import FAST, run_cli
from impactrl.config import TrainConfig
from impactrl.data.rollout import DeviceTransfer, RolloutSpec, SlotStore
from impactrl.runtime.local import SharedRollouts, SharedWeights, StopRequests, actor_process
from impactrl.training import build_learner

CONTRACT_KEYS = {"env_steps", "learner_updates", "wall_time_s", "episode_return_mean", "episodes",
                 "env_steps_per_s", "policy_lag_mean", "policy_lag_max"}


def small_spec(T=3, E=2) -> RolloutSpec:
    return RolloutSpec(unroll_length=T, num_envs=E, obs_shape=(4,), obs_dtype=torch.float32,
                       action_shape=(), action_dtype=torch.int64)


def test_fresh_slots_hold_sentinels():
    store = SlotStore(small_spec(), num_slots=2, shared=False)
    assert torch.isnan(store.data["obs"]).all() and torch.isnan(store.data["reward"]).all()
    assert (store.data["action"] == -1).all() and not store.data["first"].any()
    assert (store.policy_version == -1).all()


def test_gather_is_time_major_and_concatenates_envs():
    T, E = 3, 2
    store = SlotStore(small_spec(T, E), num_slots=3, shared=False)
    for slot in range(3):
        arrays = store.slot_arrays(slot)
        for t in range(T):
            arrays["reward"][t] = [100 * slot + 10 * t + e for e in range(E)]
        store.policy_version[slot] = 7 + slot
        store.actor_id[slot] = slot
    batch, meta = store.gather([2, 0])
    assert batch["reward"].shape == (T, 2 * E)
    assert batch["obs"].shape == (T + 1, 2 * E, 4)
    assert batch["reward"][1].tolist() == [210, 211, 10, 11]
    assert meta["policy_version"].tolist() == [9, 9, 7, 7]
    assert meta["actor_id"].tolist() == [2, 2, 0, 0]


def test_device_transfer_leaves_cpu_batches_alone():
    batch = {"obs": torch.arange(6.0).reshape(3, 2)}
    assert DeviceTransfer(torch.device("cpu"))(batch)["obs"] is batch["obs"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_device_transfer_reuses_pinned_buffers_without_overwriting_batches_in_flight():
    transfer = DeviceTransfer(torch.device("cuda"))
    first_cpu = {"obs": torch.randn(20, 64, 4, 84, 84), "action": torch.randint(0, 6, (20, 64))}
    second_cpu = {key: value + 1 for key, value in first_cpu.items()}
    first = transfer(first_cpu)
    staging = transfer._staging["obs"]
    second = transfer(second_cpu)
    assert transfer._staging["obs"] is staging and staging.is_pinned()
    torch.cuda.synchronize()
    for key in first_cpu:
        assert torch.equal(first[key].cpu(), first_cpu[key]) and torch.equal(second[key].cpu(), second_cpu[key])


def test_full_queue_makes_actors_wait():
    """With nobody consuming, an actor fills every slot and then blocks: memory stays bounded."""
    config = TrainConfig(env="CartPole-v1", num_actors=1, envs_per_actor=2, batch_size=2, unroll_length=5,
                         queue_slots=3)
    learner, store = build_learner(config, None)
    ctx = mp.get_context("spawn")
    weights = SharedWeights(learner.agent, ctx)
    weights.publish(learner.agent, 5)
    rollouts = SharedRollouts(store, config.slots_per_batch, ctx)
    stop, errors = ctx.Event(), ctx.Queue()
    process = ctx.Process(target=actor_process, args=(config, 0, 0, weights, rollouts, stop, errors), daemon=True)
    process.start()
    try:
        committed = []
        deadline = time.monotonic() + 60
        while len(committed) < 3 and time.monotonic() < deadline:
            try:
                committed.append(rollouts.full.get(timeout=1.0))
            except Exception:
                pass
        assert sorted(committed) == [0, 1, 2]
        time.sleep(2.0)  # the actor is now waiting for a free slot
        assert rollouts.full.empty() and process.is_alive()
        assert store.policy_version.tolist() == [5, 5, 5]
        # The unroll is consistent: x_T of a slot is x_0 of the next one the same actor wrote.
        first, second = store.slot_arrays(committed[0]), store.slot_arrays(committed[1])
        assert (first["obs"][-1] == second["obs"][0]).all()
        assert not torch.isnan(store.data["behaviour_log_prob"]).any()
    finally:
        stop.set()
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_train_writes_contract_outputs(run_dir: Path):
    run_cli("train", "--env", "CartPole-v1", "--total-env-steps", "4000", "--out", str(run_dir), *FAST, check=True)
    records = read_metrics(run_dir)
    assert records and all(CONTRACT_KEYS <= set(record) for record in records)
    assert records[-1]["env_steps"] >= 4000
    assert any(record["episode_return_mean"] is not None for record in records)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["total_env_steps"] == 4000
    assert (run_dir / "checkpoints" / "latest.pt").resolve().is_file()
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tb").iterdir())
    result = run_cli("eval", str(run_dir), "--episodes", "3", check=True)
    evaluation = json.loads(result.stdout.strip().splitlines()[-1])
    assert evaluation["episodes"] == 3 and {"return_mean", "return_std"} <= set(evaluation)


def start_training(run_dir: Path, *args: str, min_updates: int = 1) -> subprocess.Popen:
    """A run with a budget it will not reach, once it has logged ``min_updates`` learner updates."""
    process = subprocess.Popen(
        [sys.executable, "-m", "impactrl", "train", "--total-env-steps", "100000000", "--out", str(run_dir),
         *FAST, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and process.poll() is None:
        try:
            records = read_metrics(run_dir)
        except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or a line half-written
            records = []
        if records and records[-1]["learner_updates"] >= min_updates:
            return process
        time.sleep(0.5)
    process.kill()
    raise AssertionError(f"training did not start: {process.communicate()[1][-2000:]}")


def test_stopped_run_resumes_with_its_version_and_env_steps(run_dir: Path):
    process = start_training(run_dir, min_updates=40)
    try:
        process.send_signal(signal.SIGTERM)  # what a scheduler sends; Ctrl-C takes the same path
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:  # a hung stop must not outlive the test
            process.kill()
    assert process.returncode == 130, stderr
    before = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["learner"]
    assert before["env_steps"] > 0 and before["updates"] > 0
    target = before["env_steps"] + 3200
    run_cli("train", "--resume", str(run_dir), "--total-env-steps", str(target), check=True)
    after = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["learner"]
    assert after["env_steps"] >= target
    steps_per_update = 8 * 20  # FAST: batch of 8 unrolls of 20 steps, one update each
    assert after["updates"] == before["updates"] + (after["env_steps"] - before["env_steps"]) // steps_per_update
    resumed = [r for r in read_metrics(run_dir) if r["env_steps"] > before["env_steps"]]
    assert resumed and resumed[0]["learner_updates"] > before["updates"]
    assert resumed[0]["wall_time_s"] >= before["wall_time_s"]
    # Actors got the resumed version number: had it restarted at 0, the lag would be ~updates.
    lags = [r["policy_lag_max"] for r in resumed if r["policy_lag_max"] is not None]
    assert before["updates"] >= 40 and lags and max(lags) < 20


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_killed_actor_stops_the_run_with_a_checkpoint(run_dir: Path):
    process = start_training(run_dir)
    try:
        # spawn also starts a resource tracker; the actors are the children running spawn_main.
        actors = [pid for pid in children_of(process.pid)
                  if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert actors, "no actor processes found"
        os.kill(actors[0], signal.SIGKILL)
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert "died with exit code -9" in stderr
    assert (run_dir / "checkpoints" / "latest.pt").resolve().is_file()


def test_continuous_control_runs_end_to_end_with_normalisation(run_dir: Path):
    """Hopper with the PPO MuJoCo preset: Gaussian head, separate critic, obs/reward normalisation."""
    run_cli("train", "--algo", "ppo", "--env", "Hopper-v5", "--unroll-length", "256", "--num-minibatches", "4",
            "--update-epochs", "2", "--total-env-steps", "2048", "--out", str(run_dir), "--log-interval-s", "0.5",
            check=True)
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)
    assert state["agent"]["obs_norm.count"].item() > 1000  # statistics were learned and saved
    assert state["learner"]["updates"] == (2048 // 512) * 2 * 4
    result = run_cli("eval", str(run_dir), "--episodes", "2", check=True)
    assert json.loads(result.stdout.splitlines()[-1])["episodes"] == 2


def test_bench_reports_throughput_and_where_the_time_goes():
    result = run_cli("bench", "--env", "CartPole-v1", "--seconds", "8", "--warmup-seconds", "3", *FAST, check=True)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["env_steps_per_s"] > 0
    actor = [summary[f"actor_{stage}_fraction"] for stage in ("env", "inference", "wait")]
    assert all(0 <= share <= 1 for share in actor) and abs(sum(actor) - 1) < 1e-6
    assert 0 <= summary["learner_wait_fraction"] <= 1 and 0 <= summary["learner_train_fraction"] <= 1


def test_a_stop_signal_waits_for_the_learner_loop_and_a_second_one_raises():
    previous = signal.getsignal(signal.SIGTERM)
    with StopRequests() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in this thread at the next bytecode boundary
        assert stops.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) is previous


def hold_weights_lock(weights: SharedWeights, holding) -> None:
    weights._lock.acquire()
    holding.set()
    time.sleep(120)


def test_publish_gives_up_on_a_lock_a_killed_actor_held():
    ctx = mp.get_context("spawn")
    agent = torch.nn.Linear(2, 2)
    weights = SharedWeights(agent, ctx)
    holding = ctx.Event()
    holder = ctx.Process(target=hold_weights_lock, args=(weights, holding), daemon=True)
    holder.start()
    assert holding.wait(60)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    began = time.monotonic()
    weights.publish(agent, 7)  # returns instead of waiting for a lock nobody will release
    assert time.monotonic() - began < 10 and weights.version() != 7
