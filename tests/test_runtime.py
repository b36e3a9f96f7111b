"""The local runtime with real processes: slot layout, backpressure, metrics, resume, actor death."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import yaml

from conftest import FAST, FINISHED_RUN_STEPS, run_cli
from impactrl.config import TrainConfig
from impactrl.data.rollout import BatchAssembler, RolloutSpec, SlotStore, data_bytes, restack_frames, to_device
from impactrl.runtime.actor import Actor
from impactrl.metrics import MetricsWriter
from impactrl.runtime.learner import LEARNER_STAGES, FrameSample, Learner, LearnerLoop
from impactrl.runtime.local import LocalActors, SharedWeights
from impactrl.runtime.prefetch import Prefetcher
from impactrl.runtime.supervision import StopRequests
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
    batch, meta = store.assemble([2, 0])
    assert batch["reward"].shape == (T, 2 * E)
    assert batch["obs"].shape == (T + 1, 2 * E, 4)
    assert batch["reward"][1].tolist() == [210, 211, 10, 11]
    assert meta["policy_version"].tolist() == [9, 9, 7, 7]
    assert meta["actor_id"].tolist() == [2, 2, 0, 0]


def reference_gather(store: SlotStore, indices: list[int]) -> dict[str, torch.Tensor]:
    """The batch layout as the learner built it before copy-once batches: index_select, transpose."""
    index = torch.as_tensor(indices)
    batch = {}
    for key, tensor in store.data.items():
        chosen = tensor.index_select(0, index)
        batch[key] = chosen.flatten(0, 1) if key.startswith("core_state_") else chosen.transpose(0, 1).flatten(1, 2)
    return batch


@pytest.mark.parametrize("spec", [
    small_spec(),
    dataclasses.replace(small_spec(), core_state_shapes=((3, 5), (3, 5)), num_envs=3),  # an LSTM's (h, c)
    dataclasses.replace(small_spec(), reward_norm=True, action_shape=(2,), action_dtype=torch.float32),
    RolloutSpec(unroll_length=4, num_envs=2, obs_shape=(4, 6, 6), obs_dtype=torch.uint8, action_shape=(),
                action_dtype=torch.int64, frame_stack=4),
], ids=["plain", "lstm", "continuous-reward-norm", "frames"])
def test_copy_once_batches_equal_the_transposing_gather_for_every_field(spec):
    store = SlotStore(spec, num_slots=4, shared=False)
    generator = torch.Generator().manual_seed(0)
    for tensor in store.tensors():
        if tensor.dtype == torch.bool:
            tensor.copy_(torch.rand(tensor.shape, generator=generator) < 0.5)
        elif tensor.is_floating_point():
            tensor.copy_(torch.randn(tensor.shape, generator=generator))
        else:
            tensor.copy_(torch.randint(0, 3, tensor.shape, generator=generator))  # task ids, actions, frames
    store.stage_seconds.abs_()
    batch, meta = store.assemble([3, 1, 2])
    expected = reference_gather(store, [3, 1, 2])
    assert batch.keys() == expected.keys()
    for key in expected:
        assert batch[key].dtype == expected[key].dtype and torch.equal(batch[key], expected[key]), key
    E = spec.num_envs
    assert meta["policy_version"].tolist() == store.policy_version[[3, 1, 2]].repeat_interleave(E).tolist()
    assert torch.equal(meta["stage_seconds"], store.stage_seconds[[3, 1, 2]])
    if spec.reward_norm:
        assert torch.equal(meta["reward_stats"], store.reward_stats[[3, 1, 2]])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
def test_deduplicated_frames_rebuild_the_actors_stacks_bit_for_bit(backend):
    """Real Atari envs, episodes cut every 7 steps and lives lost (episodic life), so unrolls hold
    resets and irregular stacks; the learner's rebuilt observations equal what the agent saw."""
    config = TrainConfig(env="ALE/Breakout-v5", envs_per_actor=3, unroll_length=20, max_episode_steps=7,
                         env_backend=backend, unrolls_per_batch=3)
    learner, spec = build_learner(config, None)
    assert spec.frame_stack == 4 and data_bytes(spec) * 2.9 < data_bytes(dataclasses.replace(spec, frame_stack=1))
    actor = Actor(config, actor_id=0)
    actor.agent.load_state_dict(learner.agent.state_dict())
    store = SlotStore(spec, num_slots=1, shared=False)
    seen, write = [], actor._write_inputs
    actor._write_inputs = lambda arrays, t: (seen.append(actor.obs.copy()), write(arrays, t))
    try:
        for _ in range(6):
            seen.clear()
            actor.unroll(store.slot_arrays(0))
            batch = restack_frames(store.assemble([0])[0])
            assert batch["obs"].dtype == torch.uint8 and torch.equal(batch["obs"], torch.from_numpy(np.stack(seen)))
    finally:
        actor.close()
    assert batch["first"][1:].any()


def test_to_device_leaves_cpu_batches_alone():
    batch = {"obs": torch.arange(6.0).reshape(3, 2)}
    assert to_device(batch, torch.device("cpu"))["obs"] is batch["obs"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_pinned_assembled_batches_reach_the_device_intact():
    spec = small_spec()
    store = SlotStore(spec, num_slots=2, shared=False)
    for tensor in store.tensors():
        tensor.zero_()
    assembler = BatchAssembler(spec, 2, pin_memory=True)
    for round_ in range(3):
        store.data["reward"].fill_(round_)
        for slot in range(2):
            assembler.add(*store.unroll(slot))
        batch, _ = assembler.take()
        assert batch["reward"].is_pinned()
        moved = to_device(batch, torch.device("cuda"))
        torch.cuda.synchronize()
        assert (moved["reward"] == round_).all()


def start_local_actors(config: TrainConfig) -> tuple[Learner, SlotStore, SharedWeights, LocalActors]:
    """The local runtime's actor processes for ``config``, started with weights of version 5."""
    learner, spec = build_learner(config, None)
    ctx = mp.get_context("spawn")
    store = SlotStore(spec, config.effective_rollout_slots, shared=True)
    weights = SharedWeights(learner.agent, ctx)
    weights.publish(learner.agent, 5)
    actors = LocalActors(config, learner.link(), store, weights, ctx, print)
    actors.start_all()
    return learner, store, weights, actors


def wait_for(condition, failure: str, timeout_s: float = 30) -> None:
    """Poll ``condition`` until it holds; fail with ``failure`` after ``timeout_s`` (within the fast
    tier's 60 s a test, so that the failure says what it waited for)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


def test_the_dead_unit_sample_takes_a_different_step_of_each_of_the_newest_batches():
    sample = FrameSample(size=12)
    for batch in range(5):  # obs [T=3, B=4]: the value says batch, step and unroll
        steps, unrolls = torch.meshgrid(torch.arange(3), torch.arange(4), indexing="ij")
        sample.add(100 * batch + 10 * steps + unrolls)
        assert sample.full() == (batch >= 2)
    frames = sample.frames()
    assert frames.tolist() == [220, 221, 222, 223, 300, 301, 302, 303, 410, 411, 412, 413]  # batches 2-4, steps 2, 0, 1
    assert all(kept._base is None for kept in sample.batches)  # copies: the batches they came from can be freed


def test_full_slots_make_actors_wait():
    """With nobody consuming, an actor fills every slot it owns and then blocks: memory stays bounded."""
    config = TrainConfig(env="CartPole-v1", num_actors=1, envs_per_actor=2, unrolls_per_batch=2, unroll_length=5,
                         rollout_slots=3)
    learner, store, weights, actors = start_local_actors(config)
    try:
        # The learner reads until one batch (one slot here) is complete, then leaves the rest
        # unread: the actor fills its other two slots and the freed one, then waits.
        deadline = time.monotonic() + 30
        while not actors.assembler and time.monotonic() < deadline:
            assert actors.actors[0].process.is_alive(), "the actor process ended"
            actors._receive(1.0)
        assert actors.assembler, "the actor wrote no unroll"
        commits = actors.actors[0].commits
        # Polled, not slept: slot 0, read and freed, is written again after slots 1 and 2 ...
        wait_for(lambda: store.created_at[0] > store.created_at[2], "the actor never rewrote the freed slot")
        # ... and the actor then beats from its wait for a free slot (every 0.5 s; an actor still
        # writing would commit many more unrolls meanwhile, and the count below would catch them).
        rewritten = time.monotonic()
        wait_for(lambda: actors.heartbeats[0].item() >= rewritten + 0.4, "the actor stopped sending heartbeats")
        actors._receive(0.5)
        assert len(actors.assembler) == 1 and actors.assembler.filling == 0
        assert commits.poll() and actors.actors[0].process.is_alive()
        unread = 0
        while commits.poll():
            commits.recv()
            unread += 1
        assert unread == 3  # slots 1, 2 and the freed 0, each written once more: bounded
        # The unroll is consistent: x_T of one unroll is x_0 of the next one the same actor wrote.
        first, meta = actors.assembler.take()
        assert meta["policy_version"].tolist() == [5, 5]
        second = store.assemble([1])[0]
        assert (first["obs"][-1] == second["obs"][0]).all()
        assert not torch.isnan(first["behaviour_log_prob"]).any()
    finally:
        actors.stop_all()


def test_actors_with_unrolls_ready_are_read_in_turn():
    """Each actor with an unroll waiting gets its turn: the first actor's queue does not go first
    every time while the others' unrolls age."""
    config = TrainConfig(env="CartPole-v1", num_actors=2, envs_per_actor=2, unrolls_per_batch=2, unroll_length=5,
                         rollout_slots=6)
    learner, store, weights, actors = start_local_actors(config)
    try:
        deadline = time.monotonic() + 30
        while not all(store.policy_version == 5) and time.monotonic() < deadline:
            assert all(actor.process.is_alive() for actor in actors.actors), "an actor process ended"
            time.sleep(0.05)  # every slot of both actors is written and waits to be read
        sources = []
        while len(sources) < 6 and time.monotonic() < deadline:
            actors._receive(1.0)
            if actors.assembler:
                sources += actors.assembler.take()[1]["slot_actor_id"].tolist()
        assert sources == [0, 1, 0, 1, 0, 1]
    finally:
        actors.stop_all()


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_restarted_synchronous_actor_waits_for_a_publication_newer_than_its_last_unroll():
    """PPO takes one unroll per actor and publication: an actor killed after its unroll arrived
    comes back waiting for the next publication instead of acting once more with the last."""
    config = TrainConfig(env="CartPole-v1", algo="ppo", num_actors=1, envs_per_actor=2, unroll_length=5)
    learner, store, weights, actors = start_local_actors(config)
    try:
        assert actors.next_batch(timeout_s=120)[1]["policy_version"].tolist() == [5, 5]  # one unroll per env
        actor = actors.actors[0]
        os.kill(actor.process.pid, signal.SIGKILL)
        actor.process.join(timeout=30)
        actors.check_health()  # restarts it
        deadline = time.monotonic() + 120
        while actors.heartbeats[0].item() > time.monotonic() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the new process beats: it is up and in its loop
        assert actors.heartbeats[0].item() <= time.monotonic(), "the restarted actor never started"
        assert actors.next_batch(timeout_s=2.0) is None  # it waits: no second unroll from publication 1
        weights.publish(learner.agent, 6)
        assert actors.next_batch(timeout_s=120)[1]["policy_version"].tolist() == [6, 6]
    finally:
        actors.stop_all()


@pytest.mark.slow
def test_train_writes_contract_outputs(finished_run: Path):
    records = read_metrics(finished_run)
    assert records and all(CONTRACT_KEYS <= set(record) for record in records)
    assert records[-1]["env_steps"] >= FINISHED_RUN_STEPS
    assert any(record["episode_return_mean"] is not None for record in records)
    assert all((record["episode_return_std"] is None) == (record["episodes"] == 0) for record in records)
    assert yaml.safe_load((finished_run / "config.yaml").read_text())["total_env_steps"] == FINISHED_RUN_STEPS
    assert (finished_run / "checkpoints" / "latest.pt").resolve().is_file()
    assert any(p.name.startswith("events.out.tfevents") for p in (finished_run / "tb").iterdir())
    result = run_cli("eval", str(finished_run), "--episodes", "3", check=True)
    evaluation = json.loads(result.stdout.strip().splitlines()[-1])
    assert evaluation["episodes"] == 3 and {"return_mean", "return_std"} <= set(evaluation)
    # A real agent's values miss the returns somewhat: an error of exactly 0 or NaN is a bug.
    assert 0 < evaluation["value_mse"] < float("inf") and evaluation["value_explained_variance"] <= 1
    assert evaluation["torso_dead_units"] == []  # CartPole's MLP torso is tanh: no ReLU layer to die


def start_training(run_dir: Path, *args: str, min_updates: int = 1, own_group: bool = False,
                   preexec_fn=None) -> subprocess.Popen:
    """A run with a budget it will not reach, once it has logged ``min_updates`` learner updates;
    ``own_group``: in a process group of its own (its pid is the group's id)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "impactrl", "train", "--total-env-steps", "100000000", "--out", str(run_dir),
         *FAST, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=own_group,
        preexec_fn=preexec_fn)
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


@pytest.mark.slow
def test_stopped_run_resumes_with_its_version_and_env_steps(run_dir: Path):
    process = start_training(run_dir, min_updates=40, own_group=True)
    try:
        # What a scheduler sends (Slurm's scancel: every process of the job); Ctrl-C takes the same path.
        os.killpg(process.pid, signal.SIGTERM)
        _, stderr = process.communicate(timeout=180)
    finally:
        if process.poll() is None:  # a hung stop must not outlive the test
            process.kill()
    assert process.returncode == 130, stderr
    assert "restarting" not in stderr and read_metrics(run_dir)[-1]["actor_restarts"] == 0  # they were stopping too
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


@pytest.mark.slow
def test_stop_at_return_ends_the_run_once_the_last_100_episodes_reach_it(run_dir: Path):
    # CartPole's random policy scores ~22 an episode; IMPALA passes 40 within a few ten thousand steps.
    run_cli("train", "--env", "CartPole-v1", "--total-env-steps", "400000", "--stop-at-return", "40",
            "--out", str(run_dir), *FAST, check=True)
    learner = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["learner"]
    assert len(learner["recent_returns"]) == 100 and sum(learner["recent_returns"]) / 100 >= 40
    assert learner["env_steps"] < 400_000
    assert "reached --stop-at-return 40 at" in (run_dir / "train.log").read_text()
    run_cli("train", "--resume", str(run_dir), "--stop-at-return", "40", check=True)  # reached: nothing to train
    assert torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["learner"]["env_steps"] == \
        learner["env_steps"]


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def assert_gone_soon(pids: list[int], what: str) -> None:
    """Every process of ``pids`` ends within 30 s (polled: a loaded machine reaps them late)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids), f"{what} outlived the process that ended"


@pytest.mark.slow
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


@pytest.mark.slow
def test_bench_reports_throughput_and_where_the_time_goes():
    result = run_cli("bench", "--env", "CartPole-v1", "--seconds", "20", "--warmup-seconds", "3", *FAST, check=True)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["env_steps_per_s"] > 0
    actor = [summary[f"actor_{stage}_fraction"] for stage in ("env", "inference", "wait")]
    assert all(0 <= share <= 1 for share in actor) and abs(sum(actor) - 1) < 1e-6
    learner = [summary[f"learner_{stage}_fraction"] for stage in LEARNER_STAGES]
    assert all(0 <= share <= 1 for share in learner) and sum(learner) <= 1 + 1e-6 and learner[3] > 0


@pytest.mark.slow
def test_bench_with_synthetic_actors_loads_the_intake_alone():
    """Simulated actors replay recorded Pong unrolls, several per process; without learning the
    learner receives, assembles and publishes, and the JSON says what was measured."""
    result = run_cli("bench", "--env", "ALE/Pong-v5", "--env-backend", "envpool", "--envs-per-actor", "2",
                     "--unrolls-per-batch", "4", "--synthetic-actors", "3", "--actors-per-process", "2", "--no-learning",
                     "--json", "--seconds", "20", "--warmup-seconds", "3", "--log-interval-s", "0.5", check=True)
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1  # --json: the object alone
    summary = json.loads(lines[-1])
    assert summary["actors"] == 3 and summary["actors_per_process"] == 2 and summary["synthetic"]
    assert not summary["learning"] and summary["frame_dedup"]
    assert summary["env_steps_per_s"] > 0 and summary["bytes_per_s"] > 0 and summary["learner_rss_mb"] > 0
    assert summary["policy_lag_mean"] >= 0 and summary["learner_train_fraction"] < 0.5
    assert summary["learner_receive_fraction"] > 0


def test_a_stop_signal_waits_for_the_learner_loop_and_a_second_one_raises():
    """The handler StopRequests installs, called as Python calls it for a signal (no signal is sent to
    pytest itself: the slow tier's runs are stopped by real SIGTERMs, SIGINTs and SIGHUPs)."""
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with StopRequests() as stops:
        handler = signal.getsignal(signal.SIGTERM)
        assert handler is not previous[signal.SIGTERM] and signal.getsignal(signal.SIGINT) == handler
        handler(signal.SIGTERM, None)
        assert stops.requested
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGTERM, None)
    assert {signum: signal.getsignal(signum) for signum in previous} == previous


def load_weights_repeatedly(weights: SharedWeights, loads: int, torn, loaded) -> None:
    """Load ``loads`` times, setting ``torn`` on a read that mixes publications and counting the
    loads in ``loaded`` (a shared value, or None)."""
    agent = torch.nn.Linear(64, 64)
    for _ in range(loads):
        version, _ = weights.load_into(agent)
        values = torch.cat([p.detach().flatten() for p in agent.parameters()]).unique()
        if values.tolist() != [float(version)]:
            torn.value = 1
        if loaded is not None:
            loaded.value += 1


class PublishedLinear:
    """A Linear layer's weights in SharedWeights; publication n fills every parameter with n."""

    def __init__(self, ctx):
        self.agent = torch.nn.Linear(64, 64)
        self.weights = SharedWeights(self.agent, ctx)

    def publish(self, version: int) -> None:
        with torch.no_grad():
            for parameter in self.agent.parameters():
                parameter.fill_(float(version))
        self.weights.publish(self.agent, version)


def test_weights_are_never_read_half_written():
    ctx = mp.get_context("spawn")
    published = PublishedLinear(ctx)
    torn = ctx.Value("b", 0, lock=False)
    published.publish(0)
    reader = ctx.Process(target=load_weights_repeatedly, args=(published.weights, 300, torn, None), daemon=True)
    reader.start()
    version = 0
    while reader.is_alive():  # it ends by itself after its 300 loads
        version += 1
        published.publish(version)
        time.sleep(0.001)  # a learner publishes once per update: readers copy in between
    reader.join(60)
    assert reader.exitcode == 0 and not torn.value and version > 10


@pytest.mark.slow  # kills a process
def test_a_reader_killed_mid_copy_blocks_nothing():
    ctx = mp.get_context("spawn")
    published = PublishedLinear(ctx)
    torn, loads = ctx.Value("b", 0, lock=False), ctx.Value("q", 0, lock=False)
    published.publish(0)
    killed = ctx.Process(target=load_weights_repeatedly, args=(published.weights, 10**9, torn, loads), daemon=True)
    killed.start()
    wait_for(lambda: loads.value >= 1000, "the reader never loaded the weights")  # it is copying, again and again
    os.kill(killed.pid, signal.SIGKILL)
    killed.join(10)
    began = time.monotonic()
    published.publish(1)
    assert time.monotonic() - began < 1.0 and published.weights.load_into(published.agent)[0] == 1
    assert not torn.value


class ReplayedUnroll:
    """A BatchSource that hands out one real unroll again and again, tagged with version 0."""

    def __init__(self, config, spec):
        self.store = SlotStore(spec, num_slots=1, shared=False)
        actor = Actor(config, actor_id=0)
        actor.unroll(self.store.slot_arrays(0))
        actor.close()
        self.store.policy_version[0] = 0
        self.assembler = BatchAssembler(spec, config.slots_per_batch)

    def next_batch(self, timeout_s):
        self.assembler.add(*self.store.unroll(0))
        return self.assembler.take()

    def check_health(self):
        """Its one unroll never fails (what the Prefetcher asks of actors)."""


def test_the_learner_publishes_at_most_every_publish_interval_updates(tmp_path: Path):
    config = TrainConfig(env="CartPole-v1", num_actors=1, envs_per_actor=2, unrolls_per_batch=2, unroll_length=5,
                         publish_interval=4, log_interval_s=1e9, checkpoint_interval_s=1e9)
    learner, spec = build_learner(config, None)
    weights = SharedWeights(learner.agent, mp.get_context("spawn"))
    writer = MetricsWriter(tmp_path, config.total_env_steps, terminal=None)
    try:
        loop = LearnerLoop(learner, ReplayedUnroll(config, spec), weights, tmp_path, writer, lambda: None)
        loop.publish()
        for _ in range(10):
            loop.step()
    finally:
        writer.close()
    assert learner.counters.updates == 10
    assert weights.publication() == 3 and weights.version() == 8  # versions 0, 4 and 8


# A step budget of three batches for IMPACT with a buffer of four places, each batch used twice.
THREE_BATCHES_OF_IMPACT = TrainConfig(algo="impact", env="CartPole-v1", num_actors=1, envs_per_actor=2,
                                      unrolls_per_batch=2, unroll_length=5, buffer_batches=4, buffer_uses=2,
                                      total_env_steps=3 * 2 * 5, log_interval_s=1e9, checkpoint_interval_s=1e9)


def test_impact_trains_every_held_use_of_its_buffer_before_the_run_ends(tmp_path: Path):
    """Budget spent with three batches in a buffer of four places: each is still used K times."""
    config = THREE_BATCHES_OF_IMPACT
    learner, spec = build_learner(config, None)
    weights = SharedWeights(learner.agent, mp.get_context("spawn"))
    writer = MetricsWriter(tmp_path, config.total_env_steps, terminal=None)
    try:
        LearnerLoop(learner, ReplayedUnroll(config, spec), weights, tmp_path, writer, lambda: None).run()
    finally:
        writer.close()
    assert learner.counters.env_steps == 30 and learner.counters.updates == 3 * 2
    assert not learner.algorithm.owes_updates()


class RandomUnrolls:
    """A runtime's actors as the Prefetcher sees them: batch k is slot k % 4 of a store of random
    unrolls with stacked frames (what it counts: batches handed out, health checks)."""

    def __init__(self, spec: RolloutSpec):
        self.store = SlotStore(spec, num_slots=4, shared=False)
        generator = torch.Generator().manual_seed(0)
        for tensor in self.store.tensors():
            tensor.copy_(torch.randint(0, 3, tensor.shape, generator=generator))  # frame indices within capacity
        self.handed_out = self.checks = 0
        self.failure: Exception | None = None

    def batch(self, k: int):
        return self.store.assemble([k % 4])

    def next_batch(self, timeout_s):
        self.handed_out += 1
        return self.batch(self.handed_out - 1)

    def check_health(self):
        self.checks += 1
        if self.failure is not None:
            raise self.failure


def test_prefetched_batches_equal_the_synchronous_ones_in_order_and_stop_at_the_budget():
    spec = RolloutSpec(unroll_length=4, num_envs=2, obs_shape=(4, 6, 6), obs_dtype=torch.uint8, action_shape=(),
                       action_dtype=torch.int64, frame_stack=4)
    actors, taken = RandomUnrolls(spec), []
    source = Prefetcher(actors, torch.device("cpu"), lambda: len(taken) < 6)
    try:
        while len(taken) < 6:
            taken.append(source.next_batch(timeout_s=10.0))
        # Polled, not slept: the collector checks the actors' health once a round, so two more
        # checks mean a whole round of its loop ran with the budget spent (and would have
        # prepared another batch then).
        checks = actors.checks
        wait_for(lambda: actors.checks >= checks + 2, "the collector stopped going round")
        # At most one past the budget: prepared as the last one was taken, before it was counted.
        extra = source.next_batch(timeout_s=0.0)
        checks = actors.checks
        wait_for(lambda: actors.checks >= checks + 2, "the collector stopped going round")
        assert source.next_batch(timeout_s=0.0) is None
    finally:
        source.stop()
    assert actors.handed_out == 6 + (extra is not None)
    assert actors.checks > 0  # the collector checks the actors' health
    for k, (batch, meta) in enumerate(taken):
        expected, expected_meta = actors.batch(k)
        expected = restack_frames(expected)  # what the learner would have done on its own thread
        assert batch.keys() == expected.keys() and "frames" not in batch
        for key in expected:
            assert torch.equal(batch[key], expected[key]), key
        for key in expected_meta:
            assert torch.equal(meta[key], expected_meta[key]), key


def test_what_the_collector_raises_is_raised_on_the_learners_thread():
    actors = RandomUnrolls(small_spec())
    source = Prefetcher(actors, torch.device("cpu"), lambda: True)
    try:
        assert source.next_batch(timeout_s=10.0) is not None
        actors.failure = RuntimeError("actor 0 failed")
        with pytest.raises(RuntimeError, match="actor 0 failed"):
            for _ in range(100):  # the ready batch, then the failure at the latest
                source.next_batch(timeout_s=0.1)
                source.check_health()
    finally:
        source.stop()


def test_a_learner_loop_fed_by_the_prefetcher_consumes_exactly_its_budget(tmp_path: Path):
    config = THREE_BATCHES_OF_IMPACT
    learner, spec = build_learner(config, None)
    weights = SharedWeights(learner.agent, mp.get_context("spawn"))
    writer = MetricsWriter(tmp_path, config.total_env_steps, terminal=None)
    source = Prefetcher(ReplayedUnroll(config, spec), learner.device,
                        lambda: learner.counters.env_steps < config.total_env_steps)
    try:
        LearnerLoop(learner, source, weights, tmp_path, writer, source.check_health).run()
    finally:
        source.stop()
        writer.close()
    assert learner.counters.env_steps == 30 and learner.counters.updates == 3 * 2
