"""Several learners (--num-learners): two learners on halves of each batch step as one learner on
the whole batch; the runtime's checks; a learner killed mid-run (slow)."""

import dataclasses
import io
import os
import signal
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from conftest import collect, run_cli, run_in_process
from test_learning import best_return
from test_runtime import assert_gone_soon, children_of, read_metrics, start_training

from impactrl.checkpoint import load_checkpoint
from impactrl.config import TrainConfig
from impactrl.data.rollout import Batch
from impactrl.runtime.distributed import DistributedGroup
from impactrl.training import build_learner

BASE = dict(env="CartPole-v1", num_actors=2, envs_per_actor=4, unroll_length=10, optimizer="adam",
            learning_rate=3e-3, total_env_steps=10_000)
# Each case with the number of whole batches (8 unrolls) fed. IMPACT with N, K > 1, normalised
# advantages and the adaptive KL (12 updates: a target refresh at 8); PPO with one minibatch per
# epoch (with several, each learner permutes its own half: the same distribution of minibatches,
# not the same minibatches) and observation normalisation.
CASES = {
    "impala": (TrainConfig(algo="impala", unrolls_per_batch=8, **BASE), 3),
    "impala-popart": (TrainConfig(algo="impala", unrolls_per_batch=8, popart=True, **BASE), 3),
    "impact": (TrainConfig(algo="impact", unrolls_per_batch=8, buffer_batches=2, buffer_uses=2,
                           normalize_advantages=True, use_kl_loss=True, **BASE), 6),
    "impact-popart": (TrainConfig(algo="impact", unrolls_per_batch=8, buffer_batches=2, buffer_uses=2,
                                  popart=True, **BASE), 6),
    "ppo": (TrainConfig(algo="ppo", update_epochs=3, num_minibatches=1, normalize_observations=True, **BASE), 2),
}


def train_on(learner, batches: list[Batch]) -> dict[str, torch.Tensor]:
    """Feed ``batches`` as the learner loop does (a batch whenever the algorithm wants one), train
    on everything taken; the agent's state after."""
    for batch in batches:
        while not learner.algorithm.wants_data():
            assert learner.update() is not None
        learner.add(batch)
    while learner.update() is not None:
        pass
    return {key: value.detach().clone() for key, value in learner.agent.state_dict().items()}


def halves(batch: Batch) -> list[Batch]:
    """A batch's unrolls (dimension 1) split between two learners."""
    return [{key: part for key, part in zip(batch, parts)}
            for parts in zip(*(value.tensor_split(2, dim=1) for value in batch.values()))]


def learner_of_two(rank: int, port: int, cases: dict, results) -> None:
    """Learner ``rank`` of two: every case on its half of each batch; its final states to ``results``."""
    group = DistributedGroup(rank, 2, port, torch.device("cpu"))
    group.join()
    states = {}
    for name, (config, batches) in cases.items():
        learner, _ = build_learner(config, None)
        learner.join(group)
        states[name] = train_on(learner, [halves(batch)[rank] for batch in batches])
    group.close()
    buffer = io.BytesIO()  # bytes, not tensors: a queued tensor's memory goes with its process
    torch.save(states, buffer)
    results.put((rank, buffer.getvalue()))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow  # about a minute here: five cases, each learned alone here and by two spawned learners
def test_two_learners_on_halves_step_as_one_learner_on_the_whole_batch():
    cases, expected = {}, {}
    for name, (config, count) in CASES.items():
        learner, unrolls = collect(config, slots=2 * count)  # two actor unrolls of 4 envs make a batch of 8
        batches = [{key: torch.cat([a[key], b[key]], dim=1) for key in a} for a, b in zip(unrolls[::2], unrolls[1::2])]
        expected[name] = train_on(learner, batches)
        cases[name] = (dataclasses.replace(config, num_learners=2), batches)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    processes = [ctx.Process(target=learner_of_two, args=(rank, port, cases, results)) for rank in range(2)]
    for process in processes:
        process.start()
    got = {rank: torch.load(io.BytesIO(states)) for rank, states in (results.get(timeout=240) for _ in processes)}
    for process in processes:
        process.join(timeout=30)
    for name in CASES:
        for key, value in expected[name].items():
            torch.testing.assert_close(got[0][name][key], value, rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")
            assert torch.equal(got[0][name][key], got[1][name][key]), f"{name}: the learners disagree on {key}"


@pytest.mark.parametrize("flags, says", [
    (["--num-learners", "3", "--num-actors", "2"], "num_learners=3 needs num_actors >= 3"),
    (["--num-learners", "2", "--unrolls-per-batch", "8", "--envs-per-actor", "8"],
     "unrolls_per_batch=8 must be a multiple of num_learners * envs_per_actor = 16 (each learner takes an equal "
     "share of every batch): e.g. --unrolls-per-batch 16 or --envs-per-actor 4"),
    (["--num-learners", "3", "--num-actors", "3", "--unrolls-per-batch", "8", "--envs-per-actor", "8"],
     "e.g. --unrolls-per-batch 24"),
    (["--algo", "ppo", "--num-learners", "2", "--num-actors", "3"], "ppo with num_learners=2 needs num_actors a multiple of 2"),
    (["--num-learners", "2", "--unrolls-per-batch", "16", "--envs-per-actor", "8", "--max-policy-lag", "5"],
     "max_policy_lag with num_learners > 1 is not supported"),
    (["--num-learners", "0"], "num_learners must be >= 1"),
])
def test_a_learner_count_the_run_cannot_use_is_refused_in_one_line(capsys, flags, says):
    result = run_in_process(capsys, "train", "--env", "CartPole-v1", *flags)
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) <= 2


@pytest.mark.slow
def test_cartpole_with_two_learners_reaches_450_within_500k_steps(run_dir):
    """Two learners, each fed by one actor of 4 envs, on halves of IMPALA's classic batch of 8
    unrolls: the batch, and so the learning rate, stay those of the preset (docs/learners.md)."""
    best = best_return(run_dir, 450, "--algo", "impala", "--env", "CartPole-v1", "--num-actors", "2",
                       "--num-learners", "2", "--envs-per-actor", "4", "--total-env-steps", "500000")
    assert best >= 450


def learner_pids(train_pid: int) -> list[int]:
    """The train process's children that have children of their own: the learners (their actors)."""
    return [child for child in children_of(train_pid) if children_of(child)]


@pytest.mark.slow
def test_a_killed_learner_stops_the_run_with_a_checkpoint_and_resume_continues(run_dir):
    process = start_training(run_dir, "--num-learners", "2", "--checkpoint-interval-s", "1", min_updates=30)
    part = run_dir / "checkpoints" / "learner-1" / "latest.pt"
    deadline = time.monotonic() + 120
    while not part.exists():
        assert time.monotonic() < deadline, "learner 1 wrote no checkpoint part"
        time.sleep(0.2)
    [learner] = learner_pids(process.pid)
    os.kill(learner, signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert f"learner 1 (pid {learner}) was killed by SIGKILL" in stderr and "--resume" in stderr
    saved = load_checkpoint(run_dir)["learner"]
    target = saved["env_steps"] + 3200
    run_cli("train", "--resume", str(run_dir), "--total-env-steps", str(target), check=True)
    resumed = load_checkpoint(run_dir)["learner"]
    assert resumed["env_steps"] >= target and resumed["updates"] > saved["updates"]
    first_resumed = next(r for r in read_metrics(run_dir) if r["env_steps"] > saved["env_steps"])
    assert first_resumed["learner_updates"] > saved["updates"]


@pytest.mark.slow
def test_a_killed_train_process_leaves_no_learner_or_actor_behind(run_dir):
    process = start_training(run_dir, "--num-learners", "2", min_updates=10)
    [learner] = learner_pids(process.pid)
    left = [learner, *children_of(learner), *children_of(process.pid)]
    process.kill()
    process.wait(30)
    assert_gone_soon(left, "a learner or actor")


def test_a_learners_own_part_of_a_checkpoint_is_its_data_and_the_rest_is_learner_0s():
    """What a resumed learner r > 0 loads: learner 0's state, then its own part (IMPACT's buffer,
    unabsorbed observations); without a part, no held data but learner 0's weights and target."""
    config = dataclasses.replace(CASES["impact"][0], buffer_batches=3, normalize_observations=True)
    own, unrolls = collect(config, slots=2)
    for batch in unrolls:
        own.add(batch)  # no step yet: their observations are still to be absorbed
    leader, _ = build_learner(config, None)
    leader.add(unrolls[0])
    leader.update()
    resumed, _ = build_learner(config, None)
    resumed.load_state_dict(leader.state_dict())
    resumed.load_local_part(own.local_part(own.state_dict(), own.algorithm))
    assert len(resumed.algorithm.buffer) == 2 and len(resumed._unseen_obs) == 2
    for key, value in leader.agent.state_dict().items():
        assert torch.equal(resumed.agent.state_dict()[key], value)
    resumed.drop_local_data()
    assert len(resumed.algorithm.buffer) == 0 and not resumed._unseen_obs
    for target, online in zip(resumed.algorithm.target.state_dict().values(),
                              leader.algorithm.target.state_dict().values()):
        assert torch.equal(target, online)


@pytest.mark.slow
def test_an_interrupted_run_checkpoints_every_learner_and_resumes_with_their_parts(run_dir):
    process = start_training(run_dir, "--num-learners", "2", "--algo", "impact", "--buffer-batches", "2",
                             min_updates=10)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    saved = load_checkpoint(run_dir)["learner"]
    name = f"ckpt_{saved['updates']:010d}.pt"
    assert (run_dir / "checkpoints" / "learner-1" / name).is_file()
    target = saved["env_steps"] + 3200
    run_cli("train", "--resume", str(run_dir), "--total-env-steps", str(target), check=True)
    assert "no readable part" not in (run_dir / "train.log").read_text()
    assert load_checkpoint(run_dir)["learner"]["env_steps"] >= target
