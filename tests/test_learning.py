"""Learning within a step budget, fixed seeds, through the same CLI a user runs."""

import json
from pathlib import Path

import pytest

from conftest import run_cli


def returns(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r["episode_return_mean"] for r in map(json.loads, lines) if r["episode_return_mean"] is not None]


@pytest.mark.slow
def test_impala_cartpole_reaches_450(run_dir: Path):
    run_cli("train", "--algo", "impala", "--env", "CartPole-v1", "--num-actors", "2",
            "--total-env-steps", "500000", "--seed", "1", "--out", str(run_dir), timeout=900, check=True)
    assert max(returns(run_dir)) >= 450
    result = run_cli("eval", str(run_dir), "--episodes", "20", check=True)
    assert json.loads(result.stdout.splitlines()[-1])["return_mean"] >= 400
