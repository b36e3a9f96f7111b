"""What a user sees: a live bar on a terminal, plain lines in a pipe, nothing with --quiet,
everything in train.log; a fast --help; evaluation videos; Weights & Biases offline."""

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAST, run_cli

pytestmark = pytest.mark.slow  # each test trains in a subprocess to read its terminal

SHORT = ["--env", "CartPole-v1", "--total-env-steps", "20000", *FAST]


def test_a_terminal_gets_a_live_bar(run_dir: Path):
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "impactrl", "train", *SHORT, "--out", str(run_dir)],
                               stdout=follower, stderr=follower, env=dict(os.environ, COLUMNS="160"))
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the run ended and closed the terminal
            break
        if not chunk:
            break
        output += chunk
    assert process.wait(120) == 0
    text = output.decode(errors="replace")
    assert "\r" in text and "20.0k/20.0k" in text and "updates" in text  # one bar, redrawn in place
    assert "ETA" not in text  # no plain lines
    assert (run_dir / "train.log").read_text().count("steps ") >= 2


def test_a_pipe_gets_plain_lines(tmp_path: Path):
    result = run_cli("train", *SHORT, "--out", str(tmp_path / "piped"), check=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert lines and all("ETA" in line and "/s" in line for line in lines) and "\r" not in result.stdout
    log = (tmp_path / "piped" / "train.log").read_text().splitlines()
    assert log == lines


def test_the_closing_line_does_not_repeat_the_last_one_with_dashes(tmp_path: Path):
    # A line at every learner step: the line the learner writes as the run ends comes right after
    # one, with no new steps (no rate, no return to show).
    result = run_cli("train", *SHORT, "--log-interval-s", "0.001", "--out", str(tmp_path / "run"), check=True)
    lines = [line for line in result.stdout.splitlines() if line.startswith("[")]
    steps = [int(line.split(" steps ")[1].split("(")[0].replace(",", "")) for line in lines]
    assert len(lines) > 10 and steps == sorted(set(steps)) and steps[-1] >= 20000, lines[-3:]
    assert [line for line in (tmp_path / "run" / "train.log").read_text().splitlines() if line.startswith("[")] == lines


def test_help_answers_fast_without_loading_envs():
    began = time.monotonic()
    result = run_cli("train", "--help", check=True)
    assert "--total-env-steps" in result.stdout and "--resume" in result.stdout
    assert time.monotonic() - began < 10  # ~0.4 s on an idle machine; the bound is for a loaded one
    probe = subprocess.run([sys.executable, "-c", "import sys; from impactrl.cli import main\n"
                            "try: main(['train', '--help'])\nexcept SystemExit: pass\n"
                            "print(sorted(m for m in ('torch', 'gymnasium', 'ale_py') if m in sys.modules))"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip().splitlines()[-1] == "[]"


def test_eval_writes_videos_that_decode(tmp_path: Path):
    run_dir, videos = tmp_path / "run", tmp_path / "videos"
    run_cli("train", "--env", "ALE/Pong-v5", "--num-actors", "2", "--envs-per-actor", "2", "--unrolls-per-batch", "4",
            "--total-env-steps", "400", "--max-episode-steps", "100", "--out", str(run_dir), "--quiet", check=True)
    result = run_cli("eval", str(run_dir), "--episodes", "2", "--video", str(videos), check=True)
    written = json.loads(result.stdout.splitlines()[-1])["videos"]
    assert written and all(Path(path).parent == videos for path in written)
    import cv2

    capture = cv2.VideoCapture(written[0])
    frames = []
    while (frame := capture.read()[1]) is not None:
        frames.append(frame)
    assert len(frames) > 50 and frames[0].shape == (210, 160, 3)  # the ALE screen, in colour


def test_quiet_shows_nothing_and_wandb_logs_offline_into_the_run_directory(run_dir: Path):
    result = run_cli("train", *SHORT, "--quiet", "--wandb-project", "impactrl-tests", "--out", str(run_dir), check=True)
    assert not [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert (run_dir / "train.log").read_text().count("\n") >= 2
    logs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1 and b"episode_return_mean" in logs[0].read_bytes()


def test_metrics_lines_are_strict_json_with_null_for_non_finite_values(tmp_path: Path):
    from impactrl.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path, total_env_steps=100, terminal=None)
    writer.write({"env_steps": 10, "wall_time_s": 1.0, "env_steps_per_s": None, "episode_return_mean": None,
                  "policy_lag_mean": 0.0, "learner_updates": 1, "value/explained_variance": float("nan"),
                  "actor": {"0": {"policy_lag_mean": float("inf")}}})
    writer.close()

    def refuse(token: str):
        raise AssertionError(f"non-standard JSON token {token}")

    line = json.loads((tmp_path / "metrics.jsonl").read_text(), parse_constant=refuse)
    assert line["value/explained_variance"] is None and line["actor"]["0"]["policy_lag_mean"] is None
