"""Several learners on Ray (--runtime ray --num-learners N): learners 1..N-1 as Ray actors placed by
--learner-resources, on a real local Ray instance; the checks before anything starts."""

import json
import os
import signal
import time

import pytest

from conftest import run_cli, run_in_process
from test_learning import best_return
from test_runtime import read_metrics, start_training

from impactrl.checkpoint import load_checkpoint


@pytest.mark.parametrize("flags, says", [
    (["--num-learners", "2", "--learner-resources", "GPU=1"], "--learner-resources need --runtime ray"),
    (["--runtime", "ray", "--learner-resources", "CPU=2"], "--learner-resources places learners 1..N-1"),
    (["--runtime", "ray", "--num-learners", "2", "--learner-resources", "GPU"], "'GPU' is not NAME=AMOUNT"),
    (["--runtime", "ray", "--num-learners", "2", "--envs-per-actor", "4", "--learner-resources", "fast=1"],
     "--learner-resources fast: a local Ray instance has no such resource"),
])
def test_learner_resources_the_run_cannot_use_are_refused_in_one_line(capsys, flags, says):
    result = run_in_process(capsys, "train", "--env", "CartPole-v1", "--num-actors", "2", *flags)
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) <= 2


@pytest.mark.slow
def test_cartpole_with_two_learners_on_ray_reaches_450_within_500k_steps(run_dir):
    """As on the local runtime (test_learners): two learners, each fed by one actor of 4 envs."""
    best = best_return(run_dir, 450, "--algo", "impala", "--env", "CartPole-v1", "--runtime", "ray", "--num-actors", "2",
                       "--num-learners", "2", "--envs-per-actor", "4", "--total-env-steps", "500000")
    assert best >= 450
    where = json.loads((run_dir / "run_info.learner-1.json").read_text())
    assert where["learner"]["pid"] != os.getpid() and set(where["actors"]) == {"1"}  # actor i feeds learner i % 2


@pytest.mark.slow
def test_a_killed_ray_learner_stops_the_run_with_a_checkpoint_and_resume_continues(run_dir):
    process = start_training(run_dir, "--runtime", "ray", "--num-learners", "2", "--checkpoint-interval-s", "1",
                             min_updates=30)
    part, info = run_dir / "checkpoints" / "learner-1" / "latest.pt", run_dir / "run_info.learner-1.json"
    deadline = time.monotonic() + 120
    while not (part.exists() and info.exists()):
        assert time.monotonic() < deadline, "learner 1 wrote no checkpoint part"
        time.sleep(0.2)
    learner = json.loads(info.read_text())["learner"]["pid"]
    # at the driver's priority, not Ray's default +15 for workers: learners must not yield to actors
    assert os.getpriority(os.PRIO_PROCESS, learner) == os.getpriority(os.PRIO_PROCESS, 0)
    os.kill(learner, signal.SIGKILL)
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 1
    assert f"learner 1 (pid {learner} on " in stderr and "died" in stderr and "--resume" in stderr
    saved = load_checkpoint(run_dir)["learner"]
    target = saved["env_steps"] + 3200
    run_cli("train", "--resume", str(run_dir), "--total-env-steps", str(target), timeout=600, check=True)
    resumed = load_checkpoint(run_dir)["learner"]
    assert resumed["env_steps"] >= target and resumed["updates"] > saved["updates"]
    first_resumed = next(r for r in read_metrics(run_dir) if r["env_steps"] > saved["env_steps"])
    assert first_resumed["learner_updates"] > saved["updates"]
