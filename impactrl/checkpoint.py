"""Checkpoints: written atomically, ``checkpoints/latest.pt`` always names a complete one.

A checkpoint is one ``torch.save`` file holding the agent, the optimiser, the algorithm's own
state, the learner counters (policy version, env steps) and the RNG states, plus the resolved
config, so ``impactrl eval`` needs nothing else.
"""

from __future__ import annotations

import os
import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from impactrl.errors import UserError

LATEST = "latest.pt"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def rng_states() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def save_checkpoint(run_dir: Path, state: dict[str, Any], name: str, keep: int) -> Path:
    """Write ``state`` as ``checkpoints/NAME.pt``, point ``latest.pt`` at it, keep the newest ``keep``."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.pt"
    partial = directory / f".{name}.pt.partial"
    with open(partial, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)
    link = directory / ".latest.partial"
    link.unlink(missing_ok=True)
    link.symlink_to(path.name)
    os.replace(link, directory / LATEST)
    finished = sorted(p for p in directory.glob("ckpt_*.pt") if p.is_file() and not p.is_symlink())
    for old in finished[:-keep]:
        old.unlink(missing_ok=True)
    return path


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint file, or a run directory's latest checkpoint; UserError when there is none."""
    path = Path(path)
    if path.is_dir():
        candidate = checkpoint_dir(path) / LATEST
        if not candidate.exists():
            raise UserError(f"{path} holds no checkpoint (expected {candidate})")
        return candidate
    if not path.exists():
        raise UserError(f"checkpoint or run directory {path} does not exist")
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint; a truncated, foreign or unreadable file is a UserError, not a traceback."""
    path = resolve_checkpoint(path)
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"cannot read checkpoint {path}: {reason}") from None
    required = {"agent", "optimizer", "learner", "config"}
    if not isinstance(state, dict) or not required <= set(state):
        raise UserError(f"{path} is not an impactrl checkpoint (missing {sorted(required - set(state or {}))})")
    return state
