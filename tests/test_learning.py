"""Learning within a step budget, fixed seeds, through the same CLI a user runs."""

import json
from pathlib import Path

import pytest

from conftest import run_cli


def train_returns(run_dir: Path, *args: str) -> list[float]:
    """Train through the CLI and read the mean returns it logged once a second.

    The runs are asynchronous, so the step at which a log line lands depends on the machine's
    load; the default 5 s interval gave a 15 s run three samples, and CI once saw 409 where the
    same seed logged 450-500 for its last 200k steps at 1 s.
    """
    run_cli("train", *args, "--seed", "1", "--log-interval-s", "1", "--out", str(run_dir), timeout=900, check=True)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["episode_return_mean"] for r in map(json.loads, lines) if r["episode_return_mean"] is not None]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["impala", "impact"])
def test_cartpole_reaches_450(run_dir: Path, algo: str):
    """The README's command: both reach 450 well within 500k steps with the classic presets."""
    assert max(train_returns(run_dir, "--algo", algo, "--env", "CartPole-v1", "--num-actors", "2",
                             "--total-env-steps", "500000")) >= 450
    result = run_cli("eval", str(run_dir), "--episodes", "20", check=True)
    assert json.loads(result.stdout.splitlines()[-1])["return_mean"] >= 400


@pytest.mark.slow
def test_lstm_learns_cartpole_without_velocities(run_dir: Path):
    """Memory is needed here; the full 1M-step run (≥ 300) is in docs/results.md. With 400k steps
    the async runs of one seed ended between 94 and 150; 600k leaves a margin (≈ 230 seen)."""
    assert max(train_returns(run_dir, "--env", "impactrl/CartPoleNoVelocity-v1", "--use-lstm", "--lstm-size", "64",
                             "--total-env-steps", "600000")) >= 120
