"""Learning within a step budget, fixed seeds, through the same CLI a user runs."""

import json
from pathlib import Path

import pytest

from conftest import run_cli


def returns(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["episode_return_mean"] for r in map(json.loads, lines) if r["episode_return_mean"] is not None]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["impala", "impact"])
def test_cartpole_reaches_450(run_dir: Path, algo: str):
    """The README's command: both reach 450 well within 500k steps with the classic presets."""
    run_cli("train", "--algo", algo, "--env", "CartPole-v1", "--num-actors", "2",
            "--total-env-steps", "500000", "--seed", "1", "--out", str(run_dir), timeout=900, check=True)
    assert max(returns(run_dir)) >= 450
    result = run_cli("eval", str(run_dir), "--episodes", "20", check=True)
    assert json.loads(result.stdout.splitlines()[-1])["return_mean"] >= 400


@pytest.mark.slow
def test_lstm_learns_cartpole_without_velocities(run_dir: Path):
    """Memory is needed here; the full 1M-step run (≥ 300) is in docs/results.md. With 400k steps
    the async runs of one seed ended between 94 and 150; 600k leaves a margin (≈ 230 seen)."""
    run_cli("train", "--env", "impactrl/CartPoleNoVelocity-v1", "--use-lstm", "--lstm-size", "64",
            "--total-env-steps", "600000", "--seed", "1", "--out", str(run_dir), timeout=900, check=True)
    assert max(returns(run_dir)) >= 120
