"""Settings that cannot mislead: family presets for every algorithm, derived sizes, typed config
files, warnings for settings a run does not read, budgets that cannot work."""

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import run_cli, run_in_process
from impactrl.cli import main, resolve_train_config
from impactrl.config import RENAMED, TrainConfig, bound_problems, coerce, to_yaml
from impactrl.config.bounds import bound_of
from impactrl.config.resolve import resolve
from impactrl.errors import UserError
from impactrl.training import build_learner


@pytest.mark.parametrize("algo", ["impala", "impact", "ppo"])
def test_atari_settings_apply_whatever_the_algorithm(algo):
    config = resolve_train_config(["--algo", algo, "--env", "ALE/Pong-v5"]).config
    assert config.reward_clip == "abs_one" and config.torso == "shallow_cnn"
    assert (config.frame_skip, config.frame_stack) == (4, 4)


@pytest.mark.parametrize("algo", ["impala", "impact", "ppo"])
def test_mujoco_settings_apply_whatever_the_algorithm(algo):
    config = resolve_train_config(["--algo", algo, "--env", "Hopper-v5"]).config
    assert config.separate_value_network and config.normalize_observations and config.normalize_rewards


def test_flags_still_override_the_family_preset():
    config = resolve_train_config(["--algo", "impact", "--env", "ALE/Pong-v5", "--reward-clip", "none"]).config
    assert config.reward_clip == "none"


@pytest.mark.parametrize("env", ["CartPole-v1", "Hopper-v5"])
def test_ppo_batch_is_every_actors_unroll(env):
    config = resolve_train_config(["--algo", "ppo", "--env", env, "--num-actors", "4"]).config
    assert config.effective_unrolls_per_batch == 4 * config.envs_per_actor
    assert config.steps_per_batch == 4 * config.envs_per_actor * config.unroll_length


@pytest.mark.slow
def test_ppo_with_four_actors_trains_without_a_hand_made_batch_size(run_dir: Path):
    run_cli("train", "--algo", "ppo", "--env", "Hopper-v5", "--num-actors", "4", "--unroll-length", "64",
            "--update-epochs", "1", "--num-minibatches", "4", "--total-env-steps", "512", "--out", str(run_dir),
            check=True)
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["env_steps"] == 512 and last["learner_updates"] == 2 * 4  # two batches of 4 x 64 steps


def test_a_config_file_value_of_the_wrong_type_is_one_line(tmp_path: Path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text("learning_rate: fast\nuse_lstm: 1\n")
    result = run_in_process(capsys, "train", "--config", str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "learning_rate must be a number, got 'fast'" in result.stderr
    assert "use_lstm must be true or false, got 1" in result.stderr
    assert not (tmp_path / "run").exists()


def test_settings_the_run_does_not_read_are_warned_about(tmp_path: Path, capsys):
    result = run_in_process(capsys, "train", "--algo", "impala", "--env", "CartPole-v1", "--buffer-uses", "4",
                            "--frame-skip", "2", "--total-env-steps", "10", "--out", str(tmp_path / "run"))
    assert "--buffer-uses is read by IMPACT only, not --algo impala" in result.stderr
    assert "--frame-skip is read on Atari only" in result.stderr


def test_a_step_budget_below_one_batch_is_refused(tmp_path: Path, capsys):
    result = run_in_process(capsys, "train", "--env", "CartPole-v1", "--unroll-length", "2000", "--total-env-steps", "10000",
                            "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "is less than one batch" in result.stderr


def test_rollout_data_that_cannot_fit_in_memory_is_refused(tmp_path: Path, capsys):
    result = run_in_process(capsys, "train", "--env", "ALE/Pong-v5", "--unroll-length", "100000", "--total-env-steps", "10000000",
                            "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "rollout data would need" in result.stderr and "--unroll-length" in result.stderr
    assert not (tmp_path / "run").exists()


def test_learning_rate_anneals_over_a_wall_time_budget_when_it_ends_first():
    config = resolve_train_config(["--env", "CartPole-v1", "--total-env-steps", "1000000", "--max-wall-time-s", "100",
                                   "--learning-rate", "0.001"]).config
    learner, _ = build_learner(config, None)
    learner.counters.env_steps = 100_000  # 10% of the step budget ...
    learner.wall_time_progress = 0.6  # ... but 60% of the time (run_learner sets it as time passes)
    assert learner.learning_rate() == pytest.approx(0.001 * 0.4)
    learner.wall_time_progress = 0.0
    assert learner.learning_rate() == pytest.approx(0.001 * 0.9)


def test_an_anneal_horizon_of_its_own_outlasts_the_step_and_wall_time_budgets():
    config = resolve_train_config(["--env", "CartPole-v1", "--total-env-steps", "1000000", "--max-wall-time-s", "100",
                                   "--lr-decay-env-steps", "4000000", "--learning-rate", "0.001"]).config
    learner, _ = build_learner(config, None)
    learner.counters.env_steps = 1_000_000  # the whole step budget, a quarter of the horizon
    learner.wall_time_progress = 0.9
    assert learner.learning_rate() == pytest.approx(0.001 * 0.75)
    learner.counters.env_steps = 5_000_000  # a resumed run with a raised budget, past the horizon
    assert learner.learning_rate() == 0.0


def test_an_anneal_horizon_without_annealing_is_warned_about(tmp_path: Path, capsys):
    result = run_in_process(capsys, "train", "--algo", "impact", "--env", "CartPole-v1", "--no-lr-decay",
                            "--lr-decay-env-steps", "1000", "--total-env-steps", "10", "--out", str(tmp_path / "run"))
    assert "--lr-decay-env-steps is read with --lr-decay only" in result.stderr


def test_an_integer_valued_number_is_taken_for_an_integer_setting_and_a_fraction_refused(tmp_path: Path, capsys):
    config_file = tmp_path / "budget.yaml"
    config_file.write_text("total_env_steps: 1e6\nhidden_sizes: [32.0, 16]\n")
    config = resolve_train_config(["--config", str(config_file)]).config
    assert config.total_env_steps == 1_000_000 and type(config.total_env_steps) is int
    assert config.hidden_sizes == (32, 16) and all(type(size) is int for size in config.hidden_sizes)
    for flag in (["--total-env-steps", "1e6"], ["--total-env-steps=1E6"]):
        config = resolve_train_config(flag).config
        assert config.total_env_steps == 1_000_000 and type(config.total_env_steps) is int

    config_file.write_text("total_env_steps: 1.5\n")
    with pytest.raises(UserError, match=r"budget.yaml: total_env_steps must be an integer, got 1.5$"):
        resolve_train_config(["--config", str(config_file)])
    with pytest.raises(SystemExit):
        main(["train", "--total-env-steps", "1.5", "--out", str(tmp_path / "run")])
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["impactrl train: error: --total-env-steps must be an integer, got 1.5 (see impactrl train --help)"]
    assert not (tmp_path / "run").exists()


def test_each_bound_is_declared_beside_its_field_and_checked_in_one_loop():
    assert bound_problems(TrainConfig()) == []
    found = bound_problems(TrainConfig(discount=2.0, max_policy_lag=-1, hidden_sizes=(), rmsprop_alpha=1.0,
                                       target_worker_clip=0.0, ray_actor_cpus=float("nan")))
    assert found == ["ray_actor_cpus must be >= 0, got nan", "max_policy_lag must be >= 0 or None, got -1",
                     "hidden_sizes must be positive integers, got []", "discount must be in [0, 1], got 2.0",
                     "target_worker_clip must be > 0 or None, got 0.0", "rmsprop_alpha must be in (0, 1), got 1.0"]
    bounded = {field.name for field in dataclasses.fields(TrainConfig) if bound_of(field) is not None}
    assert {"total_env_steps", "learning_rate", "num_actors", "clip_param", "keep_checkpoints"} <= bounded


def test_an_old_setting_name_still_works_with_one_warning(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setitem(RENAMED, "lr", "learning_rate")
    config = resolve_train_config(["--lr", "0.125", "--lr=0.25"]).config
    assert config.learning_rate == 0.25
    assert capsys.readouterr().err.splitlines() == [
        "impactrl train: warning: --lr is now --learning-rate (the old name will be removed)"]
    config_file = tmp_path / "old.yaml"
    config_file.write_text("lr: 0.5\n")
    assert resolve_train_config(["--config", str(config_file)]).config.learning_rate == 0.5
    assert capsys.readouterr().err.splitlines() == [
        f"impactrl train: warning: {config_file}: lr is now learning_rate (the old name will be removed)"]
    config_file.write_text("lr: 0.5\nlearning_rate: 0.25\n")
    with pytest.raises(UserError, match="lr and learning_rate are one setting"):
        resolve_train_config(["--config", str(config_file)])
    assert coerce({"lr": 0.5}, "a saved run") == {"learning_rate": 0.5} and capsys.readouterr().err == ""


def test_the_renamed_settings_take_their_old_names_by_flag_yaml_resume_and_api(tmp_path: Path, capsys):
    """batch_size -> unrolls_per_batch, queue_slots -> rollout_slots, target_update_interval -> target_update_period."""
    config = resolve_train_config(["--algo", "impact", "--batch-size", "16", "--queue-slots=12",
                                   "--target-update-interval", "5"]).config
    assert (config.unrolls_per_batch, config.rollout_slots, config.target_update_period) == (16, 12, 5)
    assert config.effective_rollout_slots == 12 and config.effective_target_update_period == 5
    assert capsys.readouterr().err.splitlines() == [
        f"impactrl train: warning: --{old} is now --{new} (the old name will be removed)"
        for old, new in [("batch-size", "unrolls-per-batch"), ("queue-slots", "rollout-slots"),
                         ("target-update-interval", "target-update-period")]]

    old_run = tmp_path / "old-run"  # a run directory written before the renames
    old_run.mkdir()
    (old_run / "config.yaml").write_text("algo: impact\nenv: CartPole-v1\nbatch_size: 24\nqueue_slots: 9\n"
                                         "target_update_interval: 7\n")
    for args in (["--config", str(old_run / "config.yaml")], ["--resume", str(old_run)]):
        config = resolve_train_config(args).config
        assert (config.unrolls_per_batch, config.rollout_slots, config.target_update_period) == (24, 9, 7)
        assert capsys.readouterr().err.splitlines() == [
            f"impactrl train: warning: {old_run / 'config.yaml'}: {old} is now {new} (the old name will be removed)"
            for old, new in RENAMED.items()]
    assert "batch_size" not in to_yaml(config) and "unrolls_per_batch: 24" in to_yaml(config)

    config = resolve(settings={"batch_size": 8}, source="impactrl.train")
    assert config.unrolls_per_batch == 8 and capsys.readouterr().err.splitlines() == [
        "impactrl train: warning: impactrl.train: batch_size is now unrolls_per_batch (the old name will be removed)"]
    assert coerce({"batch_size": 8}, "the checkpoint's config") == {"unrolls_per_batch": 8}  # saved runs: silently

    with pytest.raises(SystemExit):
        main(["train", "--batch-size", "0", "--out", str(tmp_path / "run")])
    assert capsys.readouterr().err.splitlines() == [
        "impactrl train: warning: --batch-size is now --unrolls-per-batch (the old name will be removed)",
        "impactrl train: error: unrolls_per_batch must be >= 1, got 0"]
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    help_text = capsys.readouterr().out
    assert "--batch-size (now --unrolls-per-batch)" in help_text and "--unrolls-per-batch INT" in help_text


@pytest.mark.parametrize(("algo", "env"), [("impala", "CartPole-v1"), ("impala", "ALE/Pong-v5"), ("impact", "CartPole-v1")])
def test_two_learners_split_a_presets_batch_by_fewer_envs_per_actor(algo: str, env: str, capsys):
    from impactrl.config import problems

    alone = resolve_train_config(["--algo", algo, "--env", env]).config
    config = resolve_train_config(["--algo", algo, "--env", env, "--num-learners", "2"]).config
    assert config.unrolls_per_batch == alone.unrolls_per_batch  # the batch the preset's learning rate is for
    assert config.envs_per_actor == alone.envs_per_actor // 2 and not problems(config)
    assert "envs per actor instead of the preset's" in capsys.readouterr().err


def test_envs_per_actor_given_with_two_learners_is_kept_and_refused_if_it_cannot_split():
    from impactrl.config import problems

    config = resolve_train_config(["--env", "CartPole-v1", "--num-learners", "2", "--envs-per-actor", "8"]).config
    assert config.envs_per_actor == 8
    assert any("must be a multiple of num_learners * envs_per_actor" in problem for problem in problems(config))


def test_help_wraps_each_settings_docstring_as_one_paragraph(capsys, monkeypatch):
    """A docstring's source line breaks do not reach --help: the --image-layout text (four source
    lines) reads on, the box rewrapping it at its own width."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    rows = [line.strip("│ ") for line in capsys.readouterr().out.splitlines()]
    start = rows.index("--image-layout {auto,chw,hwc}") + 1
    end = next(i for i in range(start, len(rows)) if rows[i].startswith("--"))
    widths = [len(row) for row in rows[start:end]]
    assert all(width > 0.75 * max(widths) for width in widths[:-1]), rows[start:end]


def test_clip_thresholds_without_the_correction_are_warned_about(tmp_path: Path, capsys):
    result = run_in_process(capsys, "train", "--algo", "impala", "--env", "CartPole-v1", "--off-policy-correction",
                            "none", "--clip-rho-threshold", "0.5", "--total-env-steps", "10", "--out", str(tmp_path / "run"))
    assert "--clip-rho-threshold is read with --off-policy-correction vtrace only" in result.stderr
