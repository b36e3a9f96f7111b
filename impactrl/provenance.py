"""What makes a run reproducible besides its config: who ran what, where, with which versions.

``impactrl train`` appends one line per invocation (a fresh start or a resume) to
``RUN_DIR/invocations.jsonl``; with ``config.yaml`` it says how to run it again.
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

LIBRARIES = ("impactrl", "torch", "numpy", "gymnasium", "ale-py", "minatar", "mujoco", "envpool", "ray")


def library_versions() -> dict[str, str]:
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def git_commit() -> str | None:
    """The commit of the impactrl checkout, with ``+dirty`` for uncommitted changes; None outside git."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def record_invocation(run_dir: Path, argv: list[str], resumed_from: dict | None) -> None:
    """Append this invocation to ``RUN_DIR/invocations.jsonl``."""
    entry = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": ["impactrl", *argv],
        "resumed_at": None if resumed_from is None else {key: resumed_from["learner"][key]
                                                         for key in ("env_steps", "updates")},
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "git_commit": git_commit(),
        "versions": library_versions(),
    }
    with open(Path(run_dir) / "invocations.jsonl", "a") as file:
        file.write(json.dumps(entry) + "\n")
