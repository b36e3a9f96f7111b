"""``impactrl plot``: runs that differ only in their seed are one curve, their mean and range."""

import dataclasses
import json
from pathlib import Path

import numpy as np

from impactrl.config import TrainConfig, to_yaml
from conftest import run_cli
from impactrl.plotting import group_label, mean_band, plot_runs, read_records, seed_groups, trailing_mean


def write_run(run_dir: Path, config: TrainConfig, steps: list[int], returns: list[float]) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(dataclasses.replace(config, out=run_dir)))
    lines = [json.dumps({"env_steps": x, "wall_time_s": x / 100, "episode_return_mean": y}) for x, y in zip(steps, returns)]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run_dir


def test_seeds_of_one_setting_are_one_curve(tmp_path: Path):
    base = TrainConfig(env="CartPole-v1")
    runs = [write_run(tmp_path / f"cartpole-impala-s{seed}", dataclasses.replace(base, seed=seed),
                      [0, 100, 200 + seed], [0.0, seed * 10.0, seed * 20.0]) for seed in (1, 2, 3)]
    other = write_run(tmp_path / "cartpole-impala-lr", dataclasses.replace(base, learning_rate=0.1), [0, 100], [1.0, 2.0])
    groups = seed_groups([runs[0], other, runs[1], runs[2]])
    assert groups == [runs, [other]]
    assert group_label(runs) == "cartpole-impala (3 seeds)" and group_label([other]) == "cartpole-impala-lr"

    first, second = ([0, 100, 201], [0.0, 10.0, 20.0]), ([0, 100, 202], [0.0, 20.0, 40.0])
    xs, mean, lowest, highest = mean_band([first, second], points=3)
    np.testing.assert_allclose(xs, [0, 100.5, 201])  # the range both cover
    np.testing.assert_allclose(lowest, [0.0, 10.0 + 10.0 * 0.5 / 101, 20.0])
    np.testing.assert_allclose(highest, [0.0, 20.0 + 20.0 * 0.5 / 102, 20.0 + 20.0 * 101 / 102])
    np.testing.assert_allclose(mean, (lowest + highest) / 2)
    assert plot_runs([*runs, other], tmp_path / "curves.png").stat().st_size > 0


def test_a_setting_missing_from_an_older_config_counts_as_its_default(tmp_path: Path):
    base = TrainConfig(env="CartPole-v1")
    older = write_run(tmp_path / "s1", base, [0, 100], [0.0, 1.0])
    saved = (older / "config.yaml").read_text()
    (older / "config.yaml").write_text("".join(line for line in saved.splitlines(keepends=True)
                                               if not line.startswith("stop_at_return:")))
    newer = write_run(tmp_path / "s2", dataclasses.replace(base, seed=2), [0, 100], [0.0, 2.0])
    assert seed_groups([older, newer]) == [[older, newer]]


def test_smoothing_averages_over_a_span_of_x_whatever_the_log_interval(tmp_path: Path):
    rng = np.random.default_rng(0)
    xs = np.cumsum(rng.integers(1, 50, size=200)).astype(float)
    ys = rng.normal(size=200)
    reference = [ys[(xs > x - 100) & (xs <= x)].mean() for x in xs]
    np.testing.assert_allclose(trailing_mean(xs, ys, 100), reference)
    np.testing.assert_allclose(trailing_mean(xs, ys, 0.5), ys)  # a span shorter than any gap: unchanged
    run = write_run(tmp_path / "run", TrainConfig(env="CartPole-v1"), list(map(int, xs)), list(ys))
    out = tmp_path / "smooth.png"
    assert run_cli("plot", str(run), "--smooth", "100", "--out", str(out), check=True) and out.stat().st_size > 0
    error = run_cli("plot", str(run), "--smooth", "0", "--out", str(out))
    assert error.returncode == 2 and "--smooth must be a positive span" in error.stderr


def test_a_curve_kept_as_csv_is_drawn_beside_runs(tmp_path: Path):
    kept = Path(__file__).parent.parent / "docs" / "curves" / "Breakout-impact-ent0.01-s1.csv"
    records = read_records(kept)
    assert records[-1]["env_steps"] == 10_000_000 and all(isinstance(r["return_100_games"], (float, type(None)))
                                                          for r in records)
    assert group_label([kept]) == "Breakout-impact-ent0.01-s1"
    run = write_run(tmp_path / "mine", TrainConfig(env="ALE/Breakout-v5"), [0, 5_000_000], [1.0, 100.0])
    out = tmp_path / "against.png"
    assert run_cli("plot", str(run), str(kept), "--smooth", "500000", "--out", str(out), check=True)
    assert out.stat().st_size > 0
    garbled = tmp_path / "garbled.csv"
    garbled.write_text("env_steps,episode_return_mean\n100,not a number\n")
    for path, message in ((garbled, "a header of metric names and rows of numbers"), (tmp_path / "none.csv", "cannot read it")):
        error = run_cli("plot", str(path), "--out", str(out))
        assert error.returncode != 0 and message in error.stderr and "Traceback" not in error.stderr
