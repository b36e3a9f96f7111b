"""One writer per run directory: ``RUN_DIR/.lock``, flock'ed by the ``impactrl train`` that writes there.

Two writers would interleave metrics.jsonl and overwrite each other's checkpoints. The lock is
held for the life of the run and holds the holder's pid for the message. The kernel drops an
flock when its process dies, however it dies, so a killed run's lock is simply taken over.
Actor processes do not inherit it (Python's file descriptors are not inheritable).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from impactrl.errors import UserError

LOCK_NAME = ".lock"


def _in_use(run_dir: Path, fd: int) -> UserError:
    pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    return UserError(f"{run_dir} is in use by another impactrl train (pid {pid}); wait for it to end or stop it first")


def check_unlocked(run_dir: Path) -> None:
    """UserError when a live process holds RUN_DIR's lock; reads only (a failed command writes nothing)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no lock file (or no directory): no run holds it; --out's own checks say the rest
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir, fd) from None
    finally:
        os.close(fd)  # also releases the probe's shared lock


@contextlib.contextmanager
def hold(run_dir: Path) -> Iterator[None]:
    """Hold RUN_DIR's lock for the ``with`` block; UserError (naming the holder's pid) when another has it."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise UserError(f"{run_dir}: cannot open its lock file {LOCK_NAME} ({error.strerror or error})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(run_dir, fd) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
