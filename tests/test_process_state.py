"""What a run does to the process around it: the Python API leaves the caller's settings as it
found them; a closed terminal or pipe, a hangup and repeated stop signals lose no work."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import FAST
from test_runtime import read_metrics, start_training

pytestmark = pytest.mark.slow  # each test trains with real actor processes

BUDGET = ["--total-env-steps", "30000"]


def ended(process: subprocess.Popen, timeout: float = 300) -> str:
    """Wait for ``process`` to end (killed if the test fails first); its stderr, as text."""
    try:
        _, stderr = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
    return stderr if isinstance(stderr, str) else stderr.decode()


def test_the_python_api_restores_threads_signal_handlers_and_environment(tmp_path: Path):
    import impactrl

    def handler(signum, frame):
        pass

    previous = [torch.get_num_threads(), signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)]
    torch.set_num_threads(16)
    signal.signal(signal.SIGTERM, handler)
    environment = dict(os.environ)
    try:
        for run in range(2):
            impactrl.train(env="CartPole-v1", algo="impala", num_actors=2, envs_per_actor=4, total_env_steps=4000,
                           out=str(tmp_path / f"run{run}"), quiet=True)
            assert torch.get_num_threads() == 16
            assert signal.getsignal(signal.SIGTERM) is handler
            assert signal.getsignal(signal.SIGHUP) is previous[2]
            assert dict(os.environ) == environment
    finally:
        torch.set_num_threads(previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def hangups_heard() -> None:
    """In the child: SIGHUP as a terminal's session leaves it, whatever this pytest inherited (nohup)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_a_hangup_checkpoints_and_stops_like_sigterm(run_dir: Path):
    process = start_training(run_dir, min_updates=20, preexec_fn=hangups_heard)
    process.send_signal(signal.SIGHUP)
    stderr = ended(process)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted; the latest checkpoint is kept" in (run_dir / "train.log").read_text()
    assert (run_dir / "checkpoints" / "latest.pt").resolve().is_file()


def test_under_nohup_a_hangup_is_ignored_and_the_run_finishes(run_dir: Path):
    process = subprocess.Popen(["nohup", sys.executable, "-m", "impactrl", "train", *BUDGET, "--out", str(run_dir),
                                *FAST], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 180
    while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.1)
    process.send_signal(signal.SIGHUP)
    stderr = ended(process)
    assert process.returncode == 0, stderr[-2000:]
    assert read_metrics(run_dir)[-1]["env_steps"] >= 30000


def test_a_closed_stdout_never_stops_training(run_dir: Path):
    """``impactrl train ... | head -2``: the pipe closes after two lines; the run goes on to its end."""
    process = subprocess.Popen([sys.executable, "-m", "impactrl", "train", *BUDGET, "--out", str(run_dir), *FAST],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(2):
        process.stdout.readline()
    process.stdout.close()
    stderr = ended(process)
    assert process.returncode == 0, stderr[-2000:]
    assert "BrokenPipeError" not in stderr and "Traceback" not in stderr
    assert read_metrics(run_dir)[-1]["env_steps"] >= 30000
    assert "the terminal went away" in (run_dir / "train.log").read_text()


def test_stop_signals_during_the_final_checkpoint_tear_nothing(run_dir: Path):
    """A user who presses Ctrl-C again and again: the run stops once, with a whole checkpoint."""
    process = start_training(run_dir, min_updates=20)
    deadline = time.monotonic() + 180
    while process.poll() is None and time.monotonic() < deadline:
        process.send_signal(signal.SIGINT)
        time.sleep(0.02)
    stderr = ended(process)
    assert process.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    checkpoints = run_dir / "checkpoints"
    assert not list(checkpoints.glob(".*.partial"))
    result = subprocess.run([sys.executable, "-m", "impactrl", "eval", str(run_dir), "--episodes", "1"],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
