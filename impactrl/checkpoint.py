"""Checkpoints you can trust.

A checkpoint is one ``torch.save`` file holding everything the run's future depends on (agent,
optimiser, the algorithm's state, counters, RNG states, normalisation statistics, the resolved
config as YAML text), all as tensors and plain types: it loads with ``weights_only=True``, so
nothing in a file is unpickled as code.

Writing is atomic and verifiable: the file is serialised in memory, its SHA-256 written beside
it (``NAME.pt.sha256``), both go to temporary names, are fsynced and renamed, and only then
does ``latest.pt`` move; the newest ``keep`` are kept. Loading a run directory tries its
checkpoints newest first (``latest.pt``'s first, so a copied run directory resumes where it
stopped even when the copy reset the files' times) and skips, with a warning, any that is
truncated, fails its checksum or does not load, so a crash while writing never costs more than
one checkpoint interval.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import pickle
import random
import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from impactrl.errors import UserError, write_failed

LATEST = "latest.pt"
REQUIRED_KEYS = ("agent", "optimizer", "algorithm", "learner", "rng", "config")


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def encode_python_rng(state: tuple) -> dict[str, Any]:
    """A ``random.getstate()`` tuple as a tensor and plain types."""
    version, internal, gauss_next = state
    return {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss_next}


def decode_python_rng(state: dict[str, Any]) -> tuple:
    return state["version"], tuple(state["internal"].tolist()), state["gauss_next"]


def rng_states() -> dict[str, Any]:
    """The process-wide RNG states of torch, NumPy and Python, as tensors and plain types."""
    _, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    numpy_state = {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                   "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)}
    return {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": encode_python_rng(random.getstate())}


def restore_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["position"], n["has_gauss"],
                         n["cached_gaussian"]))
    random.setstate(decode_python_rng(states["python"]))


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def save_checkpoint(run_dir: Path, state: dict[str, Any], name: str, keep: int, directory: Path | None = None,
                    milestone: str | None = None) -> Path:
    """Write ``state`` as ``checkpoints/NAME.pt`` (or ``directory/NAME.pt``, inside an existing
    folder of the run) with its checksum, point ``latest.pt`` at it, keep the newest ``keep``;
    with ``milestone``, also as ``MILESTONE.pt`` (a hard link the rotation never removes).
    RunDirFailed (one line, no partial file left) when it cannot."""
    directory = directory or checkpoint_dir(run_dir)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getbuffer()
    path = directory / f"{name}.pt"
    try:
        _save(directory, path, data, keep)
        if milestone is not None:
            for suffix in (".pt", ".pt.sha256"):
                kept = directory / f"{milestone}{suffix}"
                kept.unlink(missing_ok=True)
                os.link(directory / f"{name}{suffix}", kept)
    except BaseException as error:  # also an interruption: no partial file is left
        for partial in directory.glob(".*.partial") if directory.is_dir() else ():
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise write_failed(run_dir, path, error) from error
        raise
    return path


def _save(directory: Path, path: Path, data: memoryview, keep: int) -> None:
    directory.mkdir(exist_ok=True)  # never its parents: a deleted run directory stays deleted
    _write_atomically(directory / f"{path.name}.sha256", hashlib.sha256(data).hexdigest().encode())
    _write_atomically(path, data)
    link = directory / ".latest.partial"
    link.unlink(missing_ok=True)
    link.symlink_to(path.name)
    os.replace(link, directory / LATEST)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the renames themselves survive a crash
    finally:
        os.close(dir_fd)
    for old in checkpoints_newest_first(directory)[keep:]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)


def checkpoints_newest_first(directory: Path) -> list[Path]:
    # First the one latest.pt names: copies that reset modification times (cp -r, scp) keep
    # it, and scp turns it into a copy of that file. The rest by the time written, not the
    # update count in the name: a run resumed from an older checkpoint writes lower counts than
    # the branch it abandoned.
    files = sorted((p for p in directory.glob("ckpt_*.pt") if p.is_file() and not p.is_symlink()),
                   key=lambda p: (p.stat().st_mtime_ns, p.name), reverse=True)
    latest = directory / LATEST
    if latest.is_symlink():
        named = directory / os.readlink(latest)
        return [named, *(p for p in files if p != named)] if named in files else files
    return [latest, *files] if latest.is_file() else files


def read_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """One checkpoint file, verified; UserError (one line) when it cannot be trusted."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UserError(f"cannot read checkpoint {path}: {error.strerror or error}") from None
    digest = path.with_name(path.name + ".sha256")
    if digest.exists() and digest.read_text().strip() != hashlib.sha256(data).hexdigest():
        raise UserError(f"checkpoint {path} fails its SHA-256 check (truncated or corrupt)")
    try:
        with warnings.catch_warnings():  # torch's warnings about a foreign pickle: load_failure says what matters
            warnings.simplefilter("ignore")
            state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch raises many types for a bad file
        raise UserError(f"{path} is not a checkpoint file (torch.load failed: {load_failure(error)})") from None
    missing = sorted(set(REQUIRED_KEYS) - set(state)) if isinstance(state, dict) else list(REQUIRED_KEYS)
    if missing:
        raise UserError(f"{path} is not a checkpoint of this impactrl version (missing {', '.join(missing)})")
    return state


def load_failure(error: Exception) -> str:
    """Why torch.load refused a file, in one line. Never PyTorch's own advice to retry with
    weights_only=False: that would run whatever code an untrusted file holds."""
    text = str(error)
    unsafe = re.search(r"GLOBAL (\S+) was not an allowed global", text)
    if unsafe:
        return (f"it holds a Python object ({unsafe.group(1)}); impactrl unpickles no objects from a file, "
                "a checkpoint holds tensors and plain types only")
    if isinstance(error, pickle.UnpicklingError):
        return "its data is not a torch.save file of tensors and plain types (damaged, or another format)"
    first = text.strip().split(". ")[0].splitlines()[0] if text.strip() else type(error).__name__
    return first.split("weights_only")[0].rstrip(" ,;:(")  # torch's advice about weights_only, if any, cut off


def load_checkpoint(path: Path, name: str | None = None, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint file, or a run directory's checkpoint ``name`` or newest readable one.

    From a run directory, unreadable newer checkpoints are skipped with a warning on stderr.
    UserError when there is nothing to load.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint or run directory {path} does not exist")
    if not path.is_dir():
        return read_checkpoint(path, map_location)
    directory = checkpoint_dir(path)
    if name is not None:
        chosen = directory / (name if name.endswith(".pt") else f"{name}.pt")
        if not chosen.is_file():
            available = ", ".join(p.stem for p in checkpoints_newest_first(directory)) or "none"
            raise UserError(f"--checkpoint {name}: no such checkpoint in {directory} (available: {available})")
        return read_checkpoint(chosen, map_location)
    candidates = checkpoints_newest_first(directory) if directory.is_dir() else []
    if not candidates:
        raise UserError(f"{path} holds no checkpoint (expected {directory / 'ckpt_*.pt'})")
    failures = []
    for candidate in candidates:
        try:
            state = read_checkpoint(candidate, map_location)
        except UserError as error:
            failures.append(str(error))
            continue
        for failure in failures:
            print(f"impactrl: warning: {failure}; using {candidate.name} instead", file=sys.stderr)
        return state
    raise UserError(failures[0] + (f" (and the {len(failures) - 1} older ones)" if len(failures) > 1 else ""))
