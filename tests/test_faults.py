"""Faults, really caused: killed and hung actors, failing envs, NaN losses, a killed learner,
a corrupt checkpoint, a resume that fails. The envs that misbehave are in ``faultenvs.py``."""

import hashlib
import json
import os
import signal
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import FAST, actor_niceness, run_cli
from test_runtime import assert_gone_soon, children_of, read_metrics, start_training

pytestmark = pytest.mark.slow  # each test trains with real processes and kills or breaks them

TESTS = str(Path(__file__).parent)


def run_faulty(run_dir: Path, env: str, *args: str, timeout: float = 300, markers: Path | None = None):
    extra = {"IMPACTRL_TEST_MARKERS": str(markers)} if markers is not None else {}
    os.environ.update(extra)
    try:
        return run_cli("train", "--env", f"faultenvs:{env}", "--out", str(run_dir), *FAST, *args, timeout=timeout,
                       extra_path=TESTS)
    finally:
        for key in extra:
            os.environ.pop(key)


def actor_pids(pid: int) -> list[int]:
    # spawn also starts a resource tracker; the actors are the children running spawn_main.
    return [child for child in children_of(pid) if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()]


# SIGTERM to an actor alone (not to the whole group, as a scheduler sends it) restarts it too, after a grace.
@pytest.mark.parametrize(("algo", "kill_signal"), [("impala", signal.SIGKILL), ("ppo", signal.SIGTERM)])
def test_a_killed_actor_is_restarted_and_the_run_finishes(run_dir: Path, algo: str, kill_signal: signal.Signals):
    process = subprocess.Popen(
        [sys.executable, "-m", "impactrl", "train", "--algo", algo, "--total-env-steps", "80000", "--out", str(run_dir),
         *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # metrics.jsonl is created before the actors start: wait for its first line, and for them.
        metrics, deadline, victims = run_dir / "metrics.jsonl", time.monotonic() + 120, []
        while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size and
                                                   (victims := actor_pids(process.pid))):
            time.sleep(0.05)
        assert victims, "no actor processes found"
        # They yield the cores to the learner by --actor-niceness (set as each starts).
        yielded = actor_niceness()
        while time.monotonic() < deadline and os.getpriority(os.PRIO_PROCESS, victims[0]) != yielded:
            time.sleep(0.05)
        assert os.getpriority(os.PRIO_PROCESS, victims[0]) == yielded
        os.kill(victims[0], kill_signal)
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert f"died with exit code -{kill_signal.value}" in stderr and "restarting it" in stderr
    if kill_signal == signal.SIGKILL:  # what an OOM kill looks like: the line says whether it was one
        assert "OOM killer" in stderr and "MiB resident when last seen" in stderr
    last = read_metrics(run_dir)[-1]
    assert last["env_steps"] >= 80000 and last["actor_restarts"] >= 1
    assert sum(actor.get("restarts", 0) for actor in last["actor"].values()) == last["actor_restarts"]
    if algo == "ppo":  # synchronous: every unroll trained on was acted with the newest weights, restart or not
        assert all(record["policy_lag_max"] in (0, None) for record in read_metrics(run_dir))


def test_env_errors_are_survived_and_counted(run_dir: Path):
    result = run_faulty(run_dir, "RaisingCartPole-v0", "--total-env-steps", "30000")
    assert result.returncode == 0, result.stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    assert last["env_steps"] >= 30000 and last["env_errors"] >= 5 and last["actor_restarts"] == 0


def test_an_env_that_cannot_reset_stops_the_run_with_a_clear_message(run_dir: Path):
    result = run_faulty(run_dir, "BrokenResetCartPole-v0", "--total-env-steps", "30000")
    assert result.returncode == 1
    assert "raised on reset 3 times in a row" in result.stderr and "this env cannot be reset" in result.stderr


def test_an_env_that_fails_in_every_unroll_stops_the_run_with_its_error(run_dir: Path):
    """Each rebuild resets fine and no unroll completes: the run must still stop, with the env's own error."""
    result = run_faulty(run_dir, "StepTenRaisesCartPole-v0", "--total-env-steps", "20000", timeout=180)
    assert result.returncode == 1
    for text in ("ValueError: simulated env failure at step 10 of the episode", "faultenvs:StepTenRaisesCartPole-v0",
                 "faultenvs.py", "--max-actor-restarts"):
        assert text in result.stderr and text in (run_dir / "train.log").read_text(), text
    last = read_metrics(run_dir)[-1]
    assert last["env_errors"] > 0 and last["actor_restarts"] > 0


def test_an_actor_that_keeps_dying_exhausts_its_restart_budget(run_dir: Path):
    result = run_faulty(run_dir, "CrashingCartPole-v0", "--total-env-steps", "10000000", "--max-actor-restarts", "2")
    assert result.returncode == 1
    assert "after 2 restarts in the last 600 s" in result.stderr and "--max-actor-restarts" in result.stderr
    assert (run_dir / "checkpoints" / "latest.pt").resolve().is_file()


def test_a_hung_actor_is_killed_and_restarted(run_dir: Path, tmp_path: Path):
    """One actor, whose env hangs once: the run can only finish once it was found and restarted."""
    markers = tmp_path / "markers"
    markers.mkdir()
    result = run_faulty(run_dir, "HangingCartPole-v0", "--total-env-steps", "120000", "--actor-stall-timeout-s", "10",
                        "--num-actors", "1", markers=markers)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sent no heartbeat for 10 s (hung)" in result.stderr
    assert read_metrics(run_dir)[-1]["actor_restarts"] >= 1


def test_nan_updates_are_skipped_and_counted(run_dir: Path):
    result = run_faulty(run_dir, "SometimesNaNCartPole-v0", "--total-env-steps", "40000")
    assert result.returncode == 0, result.stderr[-3000:]
    last = read_metrics(run_dir)[-1]
    assert last["updates_skipped"] >= 1 and last["learner_updates"] > 0
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert all(torch.isfinite(value).all() for value in state["agent"].values())


def test_nan_updates_in_a_row_stop_the_run_with_advice(run_dir: Path):
    result = run_faulty(run_dir, "NaNCartPole-v0", "--total-env-steps", "1000000", "--max-skipped-updates", "5")
    assert result.returncode == 1
    # Skips are counted on the device and read at each metrics line: the run stops at the first
    # line with 5 or more in a row, every SGD step so far skipped.
    in_a_row = re.search(r"(\d+) learner updates in a row had a non-finite loss", result.stderr)
    assert in_a_row and int(in_a_row.group(1)) >= 5 and "--max-skipped-updates 5" in result.stderr
    assert "non-finite values in" in result.stderr and "reward" in result.stderr and "--learning-rate" in result.stderr
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)
    assert state["learner"]["updates_skipped"] == state["learner"]["updates"] >= 5
    assert all(torch.isfinite(value).all() for value in state["agent"].values())


def test_a_killed_learner_leaves_no_actor_and_resumes_from_its_last_checkpoint(run_dir: Path):
    process = start_training(run_dir, "--checkpoint-interval-s", "1", min_updates=30)
    actors = actor_pids(process.pid)
    assert actors
    latest = run_dir / "checkpoints" / "latest.pt"
    deadline = time.monotonic() + 120
    while not (latest.exists() and torch.load(latest, weights_only=True)["learner"]["updates"] > 0):
        assert time.monotonic() < deadline, "no checkpoint with an update in it"
        time.sleep(0.2)
    process.kill()
    process.wait(30)
    assert_gone_soon(actors, "actor processes")
    saved = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["learner"]
    assert saved["updates"] > 0
    target = saved["env_steps"] + 3200
    run_cli("train", "--resume", str(run_dir), "--total-env-steps", str(target), check=True)
    resumed = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["learner"]
    assert resumed["env_steps"] >= target and resumed["updates"] > saved["updates"]


def digest_of_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def test_truncated_newest_checkpoint_falls_back_and_a_failed_resume_changes_nothing(run_dir: Path):
    run_cli("train", "--env", "CartPole-v1", "--total-env-steps", "3000", "--out", str(run_dir), *FAST,
            "--checkpoint-interval-s", "0.2", check=True)
    checkpoints = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))
    assert len(checkpoints) >= 2
    newest, previous = checkpoints[-1], checkpoints[-2]
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    before = digest_of_tree(run_dir)
    # Settings that shape the model cannot change; nothing in the run directory may change either.
    for flags in (["--env", "Acrobot-v1"], ["--checkpoint", "ckpt_9999999999"]):
        result = run_cli("train", "--resume", str(run_dir), *flags)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) <= 2, result.stderr
        assert digest_of_tree(run_dir) == before
    # The truncated newest checkpoint fails its checksum: the one before it is used, with a warning.
    target = torch.load(previous, weights_only=True)["learner"]["env_steps"] + 1600
    result = run_cli("train", "--resume", str(run_dir), "--total-env-steps", str(target), check=True)
    assert f"{newest.name} fails its SHA-256 check" in result.stderr and f"using {previous.name}" in result.stderr
    assert read_metrics(run_dir)[-1]["env_steps"] >= target
    result = run_cli("eval", str(run_dir), "--episodes", "1", check=True)
    assert json.loads(result.stdout.splitlines()[-1])["episodes"] == 1


def test_resume_by_checkpoint_name(run_dir: Path):
    # PPO: its checkpoints hold the minibatches still to train on.
    run_cli("train", "--algo", "ppo", "--env", "CartPole-v1", "--total-env-steps", "3000", "--out", str(run_dir), *FAST,
            "--checkpoint-interval-s", "0.2", check=True)
    oldest = sorted((run_dir / "checkpoints").glob("ckpt_*.pt"))[0]
    start = torch.load(oldest, weights_only=True)["learner"]
    lines_before = len(read_metrics(run_dir))
    run_cli("train", "--resume", str(run_dir), "--checkpoint", oldest.stem, "--total-env-steps",
            str(start["env_steps"] + 1600), check=True)
    resumed = read_metrics(run_dir)[lines_before:]
    assert resumed and resumed[0]["env_steps"] >= start["env_steps"] and resumed[0]["learner_updates"] >= start["updates"]
    assert resumed[-1]["env_steps"] >= start["env_steps"] + 1600
    # The resumed branch is now the newest, whatever the update counts in the names say.
    newest = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["learner"]
    assert newest["env_steps"] == resumed[-1]["env_steps"]
