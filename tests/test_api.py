"""The CLI parses and calls the library: ``impactrl.train`` is the one entry into training, the
settings' layers live in ``impactrl.config.resolve``, and the library never reaches back into the CLI."""

import ast
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

import impactrl
from impactrl.cli import main, resolve_train_config
from impactrl.config import TrainConfig
from impactrl.config.resolve import layered, resolve
from impactrl.errors import UserError

PACKAGE = Path(impactrl.__file__).resolve().parent


def test_the_library_never_imports_the_cli():
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("cli.py", "__main__.py"):
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported |= {node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)}
        assert "impactrl.cli" not in imported, path
    probe = subprocess.run([sys.executable, "-c", "import sys, impactrl.api; print('impactrl.cli' in sys.modules)"],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr[-2000:]


def test_the_cli_stays_a_parser():
    """What parses and prints six commands, in under 300 lines (tests/test_code_shape.py bounds each function)."""
    assert len((PACKAGE / "cli.py").read_text().splitlines()) < 300


def test_the_train_command_trains_through_impactrl_train(tmp_path: Path, capsys):
    result = impactrl.TrainResult(tmp_path / "run", 1000, 10, 5, 1.5, None)
    with mock.patch("impactrl.api.train", return_value=result) as entry:
        with pytest.raises(SystemExit) as exit_:
            main(["train", "--env", "CartPole-v1", "--learning-rate", "0.01", "--out", str(tmp_path / "run")])
    assert exit_.value.code == 0
    (config,), kwargs = [call.kwargs["config"] for call in entry.mock_calls], entry.call_args.kwargs
    assert isinstance(config, TrainConfig) and config.learning_rate == 0.01 and config.out == tmp_path / "run"
    assert kwargs["invocation"] == ["train", "--env", "CartPole-v1", "--learning-rate", "0.01", "--out", str(tmp_path / "run")]
    assert kwargs["resume"] is None and kwargs["checkpoint"] is None and kwargs["quiet"] is False
    assert capsys.readouterr().out == f"done: 1,000 env steps, 10 learner updates, 1.5s; run in {tmp_path / 'run'}\n"


def test_settings_layer_over_the_presets_and_the_file_and_flags_over_them(tmp_path: Path):
    config_file = tmp_path / "settings.yaml"
    config_file.write_text("learning_rate: 0.125\nnum_actors: 3\n")
    preset = resolve(settings={"env": "CartPole-v1", "algo": "impact"})
    from_file = resolve(config_file=config_file, settings={"env": "CartPole-v1", "algo": "impact"})
    from_settings = resolve(config_file=config_file, settings={"env": "CartPole-v1", "algo": "impact", "num_actors": 4})
    flags = resolve_train_config(["--config", str(config_file), "--env", "CartPole-v1", "--algo", "impact",
                                  "--num-actors", "5"]).config
    assert preset.envs_per_actor == from_file.envs_per_actor != TrainConfig.envs_per_actor  # IMPACT's classic preset
    assert (from_file.learning_rate, from_file.num_actors) == (0.125, 3) != (preset.learning_rate, preset.num_actors)
    assert (from_settings.learning_rate, from_settings.num_actors) == (0.125, 4)
    assert (flags.learning_rate, flags.num_actors, flags.envs_per_actor) == (0.125, 5, preset.envs_per_actor)


def test_help_layers_the_file_without_loading_the_presets(tmp_path: Path):
    config_file = tmp_path / "settings.yaml"
    config_file.write_text("algo: impact\nlearning_rate: 0.125\n")
    config, given = layered(config_file=config_file, presets=False)
    assert (config.algo, config.learning_rate, config.optimizer) == ("impact", 0.125, TrainConfig.optimizer)
    assert given == {"algo", "learning_rate"}


def test_a_whole_config_is_given_alone_and_checked_like_settings(tmp_path: Path):
    with pytest.raises(UserError, match="^impactrl.train: config must be a TrainConfig, got dict$"):
        impactrl.train(config={"env": "CartPole-v1"})
    with pytest.raises(UserError, match="^impactrl.train: config is a whole TrainConfig; give it alone"):
        impactrl.train(config=TrainConfig(out=tmp_path / "run"), learning_rate=0.1)
    with pytest.raises(UserError, match="^--checkpoint picks the checkpoint of a --resume"):
        impactrl.train(config=TrainConfig(out=tmp_path / "run"), checkpoint="ckpt_0000000001")
    with pytest.raises(UserError, match="^unrolls_per_batch must be >= 1, got 0$"):
        impactrl.train(config=TrainConfig(out=tmp_path / "run", unrolls_per_batch=0))
    assert not (tmp_path / "run").exists()
