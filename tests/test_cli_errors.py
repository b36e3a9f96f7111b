"""Every mistake a user can make: one line on stderr, exit code 2, nothing left in RUN_DIR (each
command runs in this process: it is refused before it starts anything)."""

from pathlib import Path

import pytest
import torch

from conftest import run_in_process


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and "A.L.E" not in line and "Stella" not in line]
    assert len(lines) == 1, result.stderr
    assert "error:" in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_unknown_env_id(run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--env", "CartPol-v1", "--out", str(run_dir))
    assert_one_line_error(result, "unknown environment id 'CartPol-v1'", "CartPole-v1")
    assert not run_dir.exists()


@pytest.mark.parametrize("flag, value, message", [
    ("--num-actors", "0", "num_actors must be >= 1, got 0"),
    ("--unroll-length", "-3", "unroll_length must be >= 1, got -3"),
    ("--unrolls-per-batch", "0", "unrolls_per_batch must be >= 1, got 0"),
    ("--total-env-steps", "0", "total_env_steps must be >= 1, got 0"),
    ("--learning-rate", "-1", "learning_rate must be > 0"),
])
def test_non_positive_sizes(run_dir: Path, flag: str, value: str, message: str, capsys):
    result = run_in_process(capsys, "train", flag, value, "--out", str(run_dir))
    assert_one_line_error(result, message)
    assert not run_dir.exists()


@pytest.mark.parametrize("args, message", [
    (["--stop-at-return", "nan"], "stop_at_return must be a finite number or None, got nan"),
    (["--env", "MinAtar/Breakout-v1,MinAtar/Asterix-v1", "--stop-at-return", "5"], "--stop-at-return needs one task"),
])
def test_stop_at_return_needs_a_number_and_one_task(run_dir: Path, args: list[str], message: str, capsys):
    result = run_in_process(capsys, "train", *args, "--out", str(run_dir))
    assert_one_line_error(result, message)
    assert not run_dir.exists()


def test_all_problems_reported_at_once(run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--num-actors", "0", "--discount", "2", "--out", str(run_dir))
    assert_one_line_error(result, "num_actors must be >= 1", "discount must be in [0, 1]")


def test_batch_not_multiple_of_envs(run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--envs-per-actor", "8", "--unrolls-per-batch", "12", "--out", str(run_dir))
    assert_one_line_error(result, "unrolls_per_batch=12 must be a multiple of envs_per_actor=8")


MULTI_DISCRETE_ENV = """
import gymnasium as gym
import numpy as np


class TwoButtons(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.MultiDiscrete([2, 3])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}


gym.register("TwoButtons-v0", entry_point=TwoButtons)
"""


def test_unsupported_action_space(tmp_path: Path, run_dir: Path, capsys, monkeypatch):
    (tmp_path / "two_buttons.py").write_text(MULTI_DISCRETE_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = run_in_process(capsys, "train", "--env", "two_buttons:TwoButtons-v0", "--out", str(run_dir))
    assert_one_line_error(result, "action space MultiDiscrete")
    assert not run_dir.exists()


def test_unwritable_out(tmp_path: Path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "run"
    result = run_in_process(capsys, "train", "--out", str(out))
    assert_one_line_error(result, "not writable")
    assert blocker.is_file() and not out.exists()


def test_out_with_an_existing_run_needs_resume(run_dir: Path, capsys):
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    result = run_in_process(capsys, "train", "--out", str(run_dir))
    assert_one_line_error(result, "already holds files", "--resume")
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.jsonl"]


def test_resume_without_a_run(tmp_path: Path, capsys):
    result = run_in_process(capsys, "train", "--resume", str(tmp_path / "nothing-here"))
    assert_one_line_error(result, "no config.yaml")


def test_resume_without_checkpoint(run_dir: Path, capsys):
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("env: CartPole-v1\n")
    result = run_in_process(capsys, "train", "--resume", str(run_dir))
    assert_one_line_error(result, "holds no checkpoint")
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml"]


def test_corrupt_checkpoint(run_dir: Path, capsys):
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True)
    (run_dir / "config.yaml").write_text("env: CartPole-v1\n")
    (checkpoints / "ckpt_0000000001.pt").write_bytes(b"\x00not a checkpoint" * 10)
    (checkpoints / "latest.pt").symlink_to("ckpt_0000000001.pt")
    for args in (("train", "--resume", str(run_dir)), ("eval", str(run_dir))):
        result = run_in_process(capsys, *args)
        assert_one_line_error(result, "is not a checkpoint file (torch.load failed")


def test_eval_missing_path(tmp_path: Path, capsys):
    result = run_in_process(capsys, "eval", str(tmp_path / "missing"), "--episodes", "2")
    assert_one_line_error(result, "does not exist")


@pytest.mark.parametrize("seed", ["-1", "99999999999"])
def test_eval_seed_out_of_range(tmp_path: Path, capsys, seed: str):
    result = run_in_process(capsys, "eval", str(tmp_path / "missing"), "--seed", seed)
    assert_one_line_error(result, "--seed must be in [0, ")


def test_bad_config_file(tmp_path: Path, run_dir: Path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("env: CartPole-v1\nlearning_rat: 0.1\n")
    result = run_in_process(capsys, "train", "--config", str(config), "--out", str(run_dir))
    assert_one_line_error(result, "unknown setting(s) learning_rat")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown when CUDA is missing")
def test_cuda_without_cuda(run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--device", "cuda", "--out", str(run_dir))
    assert_one_line_error(result, "--device cuda")
    assert not run_dir.exists()


@pytest.mark.parametrize("env, space", [
    ("DictObservations-v0", "Dict('goal': Discrete(3), 'position': Box(-1.0, 1.0, (3,), float32))"),
    ("TupleObservations-v0", "Tuple(Box(-1.0, 1.0, (3,), float32), Discrete(3))"),
    ("TextObservations-v0", "Text(1, 8, charset="),
])
def test_observation_space_the_model_cannot_take(env: str, space: str, run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--env", f"oddenvs:{env}", "--out", str(run_dir))
    assert_one_line_error(result, f"oddenvs:{env}'s observation space {space}", "Box")
    assert not run_dir.exists()


def test_unsupported_action_space_is_named_with_its_own_bounds(run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--env", "oddenvs:GridActions-v0", "--out", str(run_dir))
    assert_one_line_error(result, "action space Box(-1.0, 1.0, (2, 2), float32) is not supported")
    assert not run_dir.exists()


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1"])
def test_seed_out_of_range(seed: str, run_dir: Path, capsys):
    result = run_in_process(capsys, "train", "--seed", seed, "--out", str(run_dir))
    assert_one_line_error(result, f"seed must be in [0, 4294967295], got {seed}")
    assert not run_dir.exists()


def test_config_file_not_utf8(tmp_path: Path, run_dir: Path, capsys):
    config = tmp_path / "latin1.yaml"
    config.write_bytes("env: CartPole-v1\n# r\xe9glages\n".encode("latin-1"))
    result = run_in_process(capsys, "train", "--config", str(config), "--out", str(run_dir))
    assert_one_line_error(result, f"cannot read config file {config}", "0xe9")
    assert not run_dir.exists()


def test_config_file_with_a_key_twice(tmp_path: Path, run_dir: Path, capsys):
    config = tmp_path / "twice.yaml"
    config.write_text("learning_rate: 0.001\nenv: CartPole-v1\nlearning_rate: 0.01\n")
    result = run_in_process(capsys, "train", "--config", str(config), "--out", str(run_dir))
    assert_one_line_error(result, f"cannot read config file {config}: the key 'learning_rate' is given twice (lines 1 and 3)")
    assert not run_dir.exists()


def test_out_that_is_a_file(tmp_path: Path, capsys):
    out = tmp_path / "a-file"
    out.write_text("keep me")
    result = run_in_process(capsys, "train", "--out", str(out))
    assert_one_line_error(result, f"--out {out} is a file")
    assert out.read_text() == "keep me"


def test_out_name_too_long(tmp_path: Path, capsys):
    for out in (tmp_path / ("x" * 300), tmp_path / "missing" / ("x" * 300)):
        result = run_in_process(capsys, "train", "--out", str(out))
        assert_one_line_error(result, f"--out {out} is not writable", "too long")
    assert list(tmp_path.iterdir()) == []


def plot_run(run_dir: Path, *lines: str) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in (
        '{"env_steps": 0, "episode_return_mean": 1.0}', *lines, '{"env_steps": 100, "episode_return_mean": 2.0}')))
    return run_dir


@pytest.mark.parametrize("name, message", [
    ("x" * 300 + ".png", "is not writable: File name too long"),
    ("a-directory", "is a directory"),
    ("curves.xyz", "cannot write a .xyz picture"),
])
def test_plot_out_it_cannot_write(name: str, message: str, tmp_path: Path, capsys):
    run = plot_run(tmp_path / "run")
    (tmp_path / "a-directory").mkdir()
    out = tmp_path / name
    result = run_in_process(capsys, "plot", str(run), "--out", str(out))
    assert_one_line_error(result, f"--out {out}", message)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a-directory", "run"]
    assert list((tmp_path / "a-directory").iterdir()) == []
