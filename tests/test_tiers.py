"""The two test tiers (conftest.py's hooks): a fast-tier test that hangs fails after
FAST_TEST_TIMEOUT_S, and a module whose tests are all slow says so when run alone."""

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAST_TEST_TIMEOUT_S

PYTEST_INI = """[pytest]
addopts = -m "not slow"
timeout = 900
markers =
    slow: the slow tier
"""


def test_each_fast_test_fails_after_the_fast_tiers_timeout(request):
    if request.config.getoption("timeout", None) is not None:
        pytest.skip("--timeout given: it applies instead")
    assert request.node.get_closest_marker("timeout").args == (FAST_TEST_TIMEOUT_S,) == (60,)


def run_pytest_on(tmp_path: Path, files: dict[str, str], *args: str, timeout_s: int = 1) -> subprocess.CompletedProcess:
    """pytest, in a child process that ends by itself, on ``files`` with this suite's conftest
    (its fast-tier timeout set to ``timeout_s``) and pyproject's tier settings."""
    conftest = (Path(__file__).parent / "conftest.py").read_text()
    assert f"FAST_TEST_TIMEOUT_S = {FAST_TEST_TIMEOUT_S}\n" in conftest
    (tmp_path / "conftest.py").write_text(conftest.replace(f"FAST_TEST_TIMEOUT_S = {FAST_TEST_TIMEOUT_S}\n",
                                                           f"FAST_TEST_TIMEOUT_S = {timeout_s}\n"))
    (tmp_path / "pytest.ini").write_text(PYTEST_INI)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


ALL_SLOW = """import pytest
pytestmark = pytest.mark.slow
def test_one(): pass
def test_two(): pass
"""
MIXED = """import threading
import pytest
def test_fast(): pass
def test_hangs(): threading.Event().wait()
@pytest.mark.slow
def test_slow(): pass
"""


def test_a_hung_fast_test_fails_and_the_tier_goes_on(tmp_path: Path):
    result = run_pytest_on(tmp_path, {"test_mixed.py": MIXED}, "test_mixed.py")
    assert "FAILED test_mixed.py::test_hangs - Failed: Timeout (>1.0s)" in result.stdout, result.stdout
    assert "1 failed, 1 passed, 1 deselected" in result.stdout
    assert "slow tier" not in result.stdout  # it ran tests


def test_a_module_whose_tests_are_all_slow_says_so_when_run_alone(tmp_path: Path):
    files = {"test_all_slow.py": ALL_SLOW, "test_mixed.py": MIXED.replace("threading.Event().wait()", "pass")}
    notice = "test_all_slow.py: all 2 tests are in the slow tier; run python -m pytest -q -m slow test_all_slow.py"
    alone = run_pytest_on(tmp_path, files, "test_all_slow.py")
    assert notice in alone.stdout and alone.returncode == 5, alone.stdout  # 5: no tests ran
    beside = run_pytest_on(tmp_path, files, "test_all_slow.py", "test_mixed.py")
    assert notice in beside.stdout and "2 passed" in beside.stdout
    whole = run_pytest_on(tmp_path, files)  # the tier as a whole: no notice for a module not asked for
    assert "slow tier" not in whole.stdout and "2 passed" in whole.stdout
