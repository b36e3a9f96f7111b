"""impactrl tune: the explored ranges and their checks, lineage, and (slow) real populations under Ray
Tune on a local instance and on a two-node cluster on this machine: an exploit's weights and
settings, trials on both nodes, a killed trial restarted, Ctrl-C and --resume."""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import run_cli

pytest.importorskip("ray.tune")

from impactrl.config import TrainConfig  # noqa: E402
from impactrl.errors import UserError  # noqa: E402
from impactrl.population.experiment import Population, plan_population  # noqa: E402
from impactrl.population.record import lineage  # noqa: E402
from impactrl.population.space import parse_explored, parse_initial, starting_points  # noqa: E402
from impactrl.population.trial import next_boundary, segment_config  # noqa: E402

CARTPOLE = ["--env", "CartPole-v1", "--algo", "impala", "--num-actors", "1", "--cpus-per-trial", "1"]


def test_explored_ranges_parse_and_clip():
    learning_rate, interval = parse_explored(["learning-rate=1e-4..3e-3:log", "log_interval_s=1..9"], TrainConfig())
    assert (learning_rate.name, learning_rate.log, learning_rate.integer) == ("learning_rate", True, False)
    assert learning_rate.clip(1.0) == 3e-3 and learning_rate.clip(0.0) == 1e-4
    rng = random.Random(0)
    assert all(1e-4 <= learning_rate.sample(rng) <= 3e-3 for _ in range(100))
    assert interval.name == "log_interval_s" and interval.clip(3.3) == 3.3


def test_integer_settings_are_rounded():
    (item,) = parse_explored(["max-skipped-updates=2..50"], TrainConfig())
    assert item.integer and item.clip(7.6) == 8 and isinstance(item.clip(7.6), int)


@pytest.mark.parametrize("spec, message", [
    ("lr=1..2", "not a numeric training setting"),
    ("env=1..2", "not a numeric training setting"),
    ("seed=1..3", "seed is not one"),
    ("learning-rate=3e-3..1e-4", "LOW must be below HIGH"),
    ("learning-rate=0..1e-3:log", "a log scale needs LOW > 0"),
    ("learning-rate=-1..1e-3", "learning_rate must be > 0"),
    ("discount=0.9..1.5", "discount"),
    ("learning-rate=1e-4:3e-3", "expected NAME=LOW..HIGH"),
    ("learning-rate=a..1", "'a' is not a number"),
])
def test_a_bad_range_is_refused_in_one_line(spec, message):
    with pytest.raises(UserError, match=message) as error:
        parse_explored([spec], TrainConfig())
    assert "\n" not in str(error.value)


def test_initial_values_one_per_trial_inside_the_range():
    explored = parse_explored(["learning-rate=1e-4..3e-3:log", "entropy-cost=0.001..0.1:log"], TrainConfig())
    initial = parse_initial(["learning-rate=1e-4,3e-4,1e-3,3e-3"], explored, 4)
    starts = starting_points(explored, initial, 4, seed=1)
    assert [start["learning_rate"] for start in starts] == [1e-4, 3e-4, 1e-3, 3e-3]
    assert all(0.001 <= start["entropy_cost"] <= 0.1 for start in starts)
    assert starts == starting_points(explored, initial, 4, seed=1)  # the same draw again
    with pytest.raises(UserError, match="2 values for a population of 4"):
        parse_initial(["learning-rate=1e-4,3e-4"], explored, 4)
    with pytest.raises(UserError, match="outside the explored range"):
        parse_initial(["learning-rate=1e-4,3e-4,1e-3,3e-2"], explored, 4)
    with pytest.raises(UserError, match="is not explored"):
        parse_initial(["discount=0.9,0.9,0.9,0.9"], explored, 4)


def test_population_settings_checked_before_ray_starts():
    explore = ["learning-rate=1e-4..3e-3:log"]
    plan = dict(population=4, explore=explore, initial=[], search="pbt", interval_env_steps=None,
                cpus_per_trial=None, quantile_fraction=0.25, max_failures=2)
    population = plan_population(TrainConfig(total_env_steps=100_000, num_actors=3), **plan)
    assert population.interval_env_steps == 5_000 and population.cpus_per_trial is None
    assert Population.from_yaml(population.to_yaml()) == population
    for change, message in [({"search": "grid"}, "--search must be one of"), ({"population": 1}, "--population"),
                            ({"interval_env_steps": 200_000}, "--interval-env-steps"),
                            ({"quantile_fraction": 0.75}, "--quantile-fraction"), ({"cpus_per_trial": 0}, "--cpus")]:
        with pytest.raises(UserError, match=message):
            plan_population(TrainConfig(total_env_steps=100_000), **{**plan, **change})
    with pytest.raises(UserError, match="--adam-eps is read by --optimizer adam only"):
        plan_population(TrainConfig(optimizer="rmsprop"), **{**plan, "explore": ["adam-eps=1e-8..1e-4:log"]})
    for config, message in [(TrainConfig(stop_at_return=100.0), "--stop-at-return"),
                            (TrainConfig(runtime="ray"), "--runtime ray")]:
        with pytest.raises(UserError, match=message):
            plan_population(config, **plan)


def test_a_segment_keeps_the_whole_budgets_schedule(tmp_path):
    base = TrainConfig(total_env_steps=1_000_000, seed=7)
    config = segment_config(base, {"learning_rate": 1e-3}, tmp_path, 2, until_env_steps=300_000)
    assert (config.total_env_steps, config.lr_decay_env_steps, config.seed, config.learning_rate, config.out) == (
        300_000, 1_000_000, 9, 1e-3, tmp_path)
    assert segment_config(dataclasses.replace(base, lr_decay_env_steps=5_000_000), {}, tmp_path, 0,
                          300_000).lr_decay_env_steps == 5_000_000
    assert [next_boundary(steps, 100, 250) for steps in (0, 99, 100, 230)] == [100, 100, 200, 250]


def test_lineage_follows_exploits_back_to_the_first_trial():
    exploits = [{"trial": "b", "source": "a", "env_steps": 100, "time": 1},
                {"trial": "c", "source": "b", "env_steps": 200, "time": 2},
                {"trial": "a", "source": "c", "env_steps": 300, "time": 3}]
    assert lineage("a", exploits) == [{"trial": "a", "from_env_steps": 0}, {"trial": "b", "from_env_steps": 100},
                                      {"trial": "c", "from_env_steps": 200}, {"trial": "a", "from_env_steps": 300}]
    assert lineage("d", exploits) == [{"trial": "d", "from_env_steps": 0}]


def test_loaded_optimizer_state_takes_the_configs_settings():
    """An exploit loads the source's optimiser state, whose saved hyperparameters must not win over
    the trial's explored ones (ray #62173): the same holds for --resume with a changed setting."""
    from impactrl.training import build_learner

    config = TrainConfig(env="CartPole-v1", optimizer="rmsprop", rmsprop_eps=0.01, learning_rate=1e-3)
    source, _ = build_learner(config, None)
    changed = dataclasses.replace(config, rmsprop_eps=0.05, learning_rate=2e-3)
    learner, _ = build_learner(changed, source.state_dict())
    assert learner.optimizer.param_groups[0]["eps"] == 0.05
    assert learner.learning_rate() == 2e-3  # what each step sets (annealed from the config's)
    for mine, theirs in zip(learner.agent.parameters(), source.agent.parameters()):
        assert torch.equal(mine, theirs)


# --- real populations under Ray Tune (slow) ---------------------------------------------------


def tune_cli(*args, timeout=600):
    return run_cli("tune", *args, timeout=timeout)


def results_of(experiment: Path) -> dict[str, list[dict]]:
    """Each trial's Tune results (result.json), by trial id."""
    found = {}
    for directory in experiment.glob("ImpactrlTrial_*"):
        results = directory / "result.json"
        lines = [json.loads(line) for line in results.read_text().splitlines() if line.strip()] if results.is_file() else []
        if lines:
            found[lines[0]["trial_id"]] = lines
    return found


@pytest.mark.slow
def test_an_exploit_copies_the_sources_checkpoint_and_trains_with_the_new_settings(tmp_path):
    out = tmp_path / "pbt"
    result = tune_cli(*CARTPOLE, "--population", "2", "--quantile-fraction", "0.5", "--total-env-steps", "4000",
                      "--interval-env-steps", "2000", "--explore", "learning-rate=1e-4..3e-3:log",
                      "--initial", "learning-rate=1e-4,3e-3", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "done: 2 trials, 1 exploits" in result.stdout
    (exploit,) = [json.loads(line) for line in (out / "pbt.jsonl").read_text().splitlines()]
    trial, source = out / "trials" / exploit["trial"], exploit["source"]
    # The trial went on from the source's Tune checkpoint at the exploit: the same file, bit for bit.
    copied = torch.load(trial / "checkpoints" / "ckpt_from_tune.pt", weights_only=True)
    (source_dir,) = out.glob(f"ImpactrlTrial_{source}*")
    saved = [torch.load(path, weights_only=True) for path in source_dir.glob("checkpoint_*/impactrl.pt")]
    at_exploit = [state for state in saved if state["learner"]["env_steps"] == exploit["env_steps"]]
    assert at_exploit, "the source's checkpoint at the exploit is kept"
    for name, tensor in at_exploit[0]["agent"].items():
        assert torch.equal(copied["agent"][name], tensor), name
    # ... and trained with its new learning rate, annealed over the whole budget.
    new_rate = exploit["settings"]["learning_rate"]["after"]
    after = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    after = [line for line in after if line["env_steps"] > exploit["env_steps"] and "optim/learning_rate" in line]
    assert after
    for line in after:
        assert line["optim/learning_rate"] <= new_rate * (1 - exploit["env_steps"] / 4000) + 1e-12
        assert line["optim/learning_rate"] >= new_rate * (1 - line["env_steps"] / 4000) - 1e-12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exploits"] == 1 and {trial["trial"] for trial in summary["trials"]} == set(results_of(out))
    evaluated = run_cli("eval", str(out), "--episodes", "2")  # the best trial's agent
    assert evaluated.returncode == 0 and json.loads(evaluated.stdout)["episodes"] == 2, evaluated.stderr[-2000:]
    plot = run_cli("plot", str(out), "--out", str(tmp_path / "population.png"))
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "population.png").stat().st_size > 0


@pytest.mark.slow
def test_trials_spread_over_two_nodes_and_a_killed_trial_restarts_from_its_checkpoint(tmp_path):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    out = tmp_path / "two-nodes"  # ten intervals per trial: on a fast machine three ended before one could be killed
    process = subprocess.Popen([sys.executable, "-m", "impactrl", "tune", *CARTPOLE, "--population", "2",
                                "--search", "random", "--total-env-steps", "20000", "--interval-env-steps", "2000",
                                "--explore", "learning-rate=1e-4..3e-3:log", "--ray-address", cluster.address,
                                "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killed = kill_a_trial_after_its_first_result(out)
        output, _ = process.communicate(timeout=600)
    finally:
        process.kill()
        cluster.shutdown()
    assert process.returncode == 0, output[-3000:]
    results = results_of(out)
    assert len({lines[-1]["node_id"] for lines in results.values()}) == 2, "one trial per node"
    assert all(lines[-1]["env_steps"] >= 20000 for lines in results.values())
    # Tune saw the failure, and the killed trial went on from its checkpoint: every invocation after
    # its first resumed one.
    assert list(out.glob(f"ImpactrlTrial_{killed}*/error.txt"))
    invocations = [json.loads(line) for line in (out / "trials" / killed / "invocations.jsonl").read_text().splitlines()]
    assert invocations[0]["resumed_at"] is None and all(line["resumed_at"] for line in invocations[1:])
    assert len(invocations) >= 3  # the interval it was killed in, trained again


def kill_a_trial_after_its_first_result(out: Path) -> str:
    """SIGKILL the Ray worker of the first trial to report a result, as it trains its next interval
    (the pid its run directory's lock holds); its trial id."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        for trial in results_of(out) if out.is_dir() else {}:
            try:
                pid = int((out / "trials" / trial / ".lock").read_text().strip() or 0)
                title = Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
                if title.startswith(b"ray::") and b"Trainable" in title:  # the trial's Tune actor
                    os.kill(pid, signal.SIGKILL)
                    return trial
            except OSError:  # between intervals: no lock, or its worker gone
                continue
        time.sleep(0.2)
    raise AssertionError("no trial reported a result")


@pytest.mark.slow
def test_ctrl_c_stops_the_experiment_and_resume_finishes_it_with_no_trial_starting_over(tmp_path):
    out = tmp_path / "stopped"
    process = subprocess.Popen([sys.executable, "-m", "impactrl", "tune", *CARTPOLE, "--population", "2",
                                "--search", "pbt", "--total-env-steps", "6000", "--interval-env-steps", "2000",
                                "--explore", "learning-rate=1e-4..3e-3:log", "--out", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []  # Ctrl-C once both trials have reported their first interval, as the terminal shows it
    for line in process.stdout:
        seen.append(line)
        if sum("env steps" in line for line in seen) == 2:
            break
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    output = "".join(seen) + output
    assert process.returncode != 0, output[-3000:]
    assert f"impactrl tune --resume {out}" in output
    resumed = tune_cli("--resume", str(out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for trial in (out / "trials").iterdir():
        invocations = [json.loads(line) for line in (trial / "invocations.jsonl").read_text().splitlines()]
        assert invocations[0]["resumed_at"] is None and all(line["resumed_at"] for line in invocations[1:]), trial
    assert all(lines[-1]["env_steps"] >= 6000 for lines in results_of(out).values())
