"""Misuse reported in issue 33, each reproduced with real runs, files, processes and CLI calls."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST
from impactrl.cli import main
from impactrl.errors import UserError
from impactrl.runlock import check_unlocked, hold

CARTPOLE = ["--env", "CartPole-v1", *FAST]


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``impactrl ARGS`` in this process: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def one_line_error(capsys, *args: str) -> str:
    code, _, err = cli(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "error:" in lines[0], err
    return lines[0]


def start_live_run(run_dir: Path) -> subprocess.Popen:
    """A CartPole run with a budget it will not reach, once it writes metrics."""
    process = subprocess.Popen([sys.executable, "-m", "impactrl", "train", *CARTPOLE, "--total-env-steps", "100000000",
                                "--out", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    metrics = run_dir / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.2)
    return process


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """README's CartPole run (IMPACT), briefly: a run directory with metrics and a checkpoint."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    subprocess.run([sys.executable, "-m", "impactrl", "train", "--algo", "impact", *CARTPOLE, "--total-env-steps", "2000",
                    "--out", str(run_dir), "--quiet"], check=True, capture_output=True, timeout=300)
    return run_dir


@pytest.mark.slow  # trains with real processes
def test_a_second_writer_on_a_live_run_directory_is_refused_naming_the_pid(tmp_path: Path, capsys):
    run_dir = tmp_path / "run"
    process = start_live_run(run_dir)
    try:
        for args in (["--out", str(run_dir)], ["--resume", str(run_dir)]):
            line = one_line_error(capsys, "train", *CARTPOLE, *args)
            assert f"is in use by another impactrl train (pid {process.pid})" in line, line
        with pytest.raises(UserError, match=f"pid {process.pid}"), hold(run_dir):
            pass  # two commands that both passed the check: the second to take the lock is refused
    finally:
        process.kill()
        process.wait(60)
    # The kernel dropped the killed run's lock: the file with its pid remains and is taken over.
    assert (run_dir / ".lock").read_text().strip() == str(process.pid)
    check_unlocked(run_dir)
    with hold(run_dir):
        assert (run_dir / ".lock").read_text().strip() == str(os.getpid())


def write_metrics_run(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"env_steps": x, "wall_time_s": x / 100,
                                                               "episode_return_mean": x / 10}) + "\n" for x in (0, 100, 200)))
    return run_dir
