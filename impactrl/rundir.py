"""The run directory of ``impactrl train``: made (or what was made removed again when it cannot be
written), held by one run at a time (``runlock``), with the run's ``config.yaml`` and a line in
``invocations.jsonl`` (``provenance``) before training starts."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator, Sequence

from impactrl.config import TrainConfig, to_yaml
from impactrl.errors import UserError
from impactrl.provenance import record_invocation
from impactrl.runlock import hold


@contextlib.contextmanager
def prepared(config: TrainConfig, invocation: Sequence[str], checkpoint: dict | None) -> Iterator[Path]:
    """The run directory of ``config``, made and held for the ``with`` block (a second train on it is
    refused), with ``config.yaml`` and ``invocation`` (resumed from ``checkpoint``, if any) written."""
    run_dir = config.run_dir()
    create_run_dir(run_dir)
    with hold(run_dir):
        try:
            write_config(run_dir, config)
            record_invocation(run_dir, list(invocation), checkpoint)
        except OSError as error:  # a full disk: the probe file of create_run_dir took no space
            raise UserError(f"--out {run_dir}: cannot write {error.filename or run_dir}: "
                            f"{error.strerror or error}") from None
        yield run_dir


def create_run_dir(run_dir: Path) -> None:
    """Create RUN_DIR (and missing parents); on failure remove what was made and explain."""
    missing = []
    parent = run_dir
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        for made in missing:
            shutil.rmtree(made, ignore_errors=True)
        raise UserError(f"--out {run_dir} is not writable: {error.strerror or error}") from None


def write_config(run_dir: Path, config: TrainConfig) -> None:
    """``RUN_DIR/config.yaml``, replaced atomically: a crash never leaves half a file."""
    partial = run_dir / ".config.yaml.partial"
    partial.write_text(to_yaml(config))
    partial.replace(run_dir / "config.yaml")
