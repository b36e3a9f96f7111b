import os
import subprocess
import sys
from pathlib import Path

import pytest

# A fast-tier test that runs longer has hung (the slowest take seconds; the tier runs in about two
# minutes): it fails then, and the tier goes on. The slow tier keeps pyproject's timeout.
FAST_TEST_TIMEOUT_S = 60
DESELECTED = pytest.StashKey[list]()  # the items that -m (or -k) left out
ALL_SLOW_MODULES = pytest.StashKey[list]()  # (path, count): modules that ran nothing, all their tests slow


def pytest_collection_modifyitems(config, items):
    """Each fast-tier test (not marked slow) fails after FAST_TEST_TIMEOUT_S unless it names its own
    timeout or ``--timeout`` was given on the command line."""
    if config.getoption("timeout", None) is not None:
        return
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FAST_TEST_TIMEOUT_S))


def pytest_deselected(items):
    if items:
        items[0].config.stash.setdefault(DESELECTED, []).extend(items)


def pytest_collection_finish(session):
    """Which modules ran nothing because all their tests are slow (deselected by the default
    ``-m 'not slow'``): those named on the command line, or every such module when the run selected
    nothing at all (and no -k chose). ``pytest tests/test_faults.py`` otherwise ends silently with
    no tests run."""
    if "not slow" not in session.config.option.markexpr:  # -m chose otherwise: it knows
        return
    deselected = session.config.stash.get(DESELECTED, [])
    nothing_ran = not session.items and not session.config.option.keyword
    selected_paths = {item.path for item in session.items}
    named = {(session.config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in session.config.args}
    by_module: dict[Path, list] = {}
    for item in deselected:
        by_module.setdefault(item.path, []).append(item)
    session.config.stash[ALL_SLOW_MODULES] = [
        (path, len(module_items)) for path, module_items in by_module.items()
        if path not in selected_paths and (path.resolve() in named or nothing_ran)
        and all(item.get_closest_marker("slow") is not None for item in module_items)]


def pytest_terminal_summary(terminalreporter, config):
    for path, count in config.stash.get(ALL_SLOW_MODULES, []):
        where = os.path.relpath(path, config.invocation_params.dir)
        tests = "its test is" if count == 1 else f"all {count} tests are"
        terminalreporter.write_line(f"{where}: {tests} in the slow tier; run python -m pytest -q -m slow {where}",
                                    yellow=True, bold=True)


# Quick settings for end-to-end runs in tests: tiny budgets, frequent logs and checkpoints.
FAST = ["--num-actors", "2", "--envs-per-actor", "4", "--unrolls-per-batch", "8", "--log-interval-s", "0.5"]


def actor_niceness() -> int:
    """The niceness an actor process of a run started from here runs at: this process's plus the
    default --actor-niceness, capped at 19 as the kernel caps it."""
    from impactrl.config import TrainConfig
    return min(os.getpriority(os.PRIO_PROCESS, 0) + TrainConfig().actor_niceness, 19)


def run_cli(*args: str, timeout: float = 300, check: bool = False, extra_path: str | None = None
            ) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [extra_path, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-m", "impactrl", *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    if check and result.returncode != 0:
        raise AssertionError(f"impactrl {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


def collect(config, slots: int):
    """A fresh learner and ``slots`` one-unroll batches written by a real Actor stepping real envs
    with the learner's initial weights."""
    from impactrl.data.rollout import SlotStore
    from impactrl.runtime.actor import Actor
    from impactrl.training import build_learner

    learner, spec = build_learner(config, None)
    actor = Actor(config, actor_id=0)
    actor.agent.load_state_dict(learner.agent.state_dict())
    store = SlotStore(spec, num_slots=slots, shared=False)
    for slot in range(slots):
        actor.unroll(store.slot_arrays(slot))
        store.policy_version[slot] = 0
    actor.close()
    return learner, [store.assemble([slot])[0] for slot in range(slots)]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def debug_checks():
    """The ops' debug checks on (types, dtypes, devices, hyperparameters): for the tests that they fire."""
    from impactrl.ops import checks

    with checks.debug_checks():
        yield


FINISHED_RUN_STEPS = 2000


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """README's CartPole run (IMPACT), briefly: one run directory with metrics, TensorBoard events
    and a checkpoint, shared by the tests that read a run (eval, plot, diagnose). A test that
    changes it works on a copy (``shutil.copytree``)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    run_cli("train", "--algo", "impact", "--env", "CartPole-v1", *FAST, "--total-env-steps", str(FINISHED_RUN_STEPS),
            "--out", str(run_dir), "--quiet", check=True)
    return run_dir


def run_in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """``impactrl ARGS`` in this process, for a command refused before it starts anything (where a
    subprocess proves nothing more): its exit code and what it printed. A command that passes every
    check fails the test instead of training."""
    from unittest import mock

    from impactrl.cli import main

    with mock.patch("impactrl.training.train", side_effect=AssertionError("passed every check: would train")):
        with pytest.raises(SystemExit) as exit_:
            main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), exit_.value.code, out, err)
