"""The reaper of a local Ray instance: kills what is left of it once the learner that started it is
gone, however it ended (a SIGKILLed driver runs no cleanup, and Ray's agents outlive it).

Run as a script (``python -I reaper.py NAME=VALUE FD``), importing nothing of impactrl or Ray. It
waits on the read end FD of a pipe whose write end only the learner holds, so its end of file
means the learner is gone. Meanwhile, every second, it notes the learner's descendants that are
Ray's (its servers, agents and workers; pid and start time, so a reused pid is never taken for one). Then
it SIGKILLs those still there and every process whose environment carries ``NAME=VALUE``
(``IMPACTRL_RAY_INSTANCE=...``), which the learner set before starting the instance (an agent's
environment can be overwritten by its process title, hence both). No other process is touched.
Linux (/proc) only; elsewhere it does nothing.
"""

import os
import select
import signal
import sys
import time
from pathlib import Path


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # gone meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            found[int(entry.name)] = (int(fields[1]), fields[19])
    return found


def is_ray(pid: int) -> bool:
    """Ray's own processes name themselves (``ray::DashboardAgent``, ``raylet``, ``gcs_server``) or
    run from its package; anything else the learner's process started (a program calling
    ``impactrl.train``) is not the reaper's."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return any(mark in command for mark in (b"ray::", b"/ray/", b"raylet", b"gcs_server"))


def descendants(root: int) -> set[tuple[int, str]]:
    """The Ray processes below ``root``."""
    table = processes()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child != os.getpid():
                if is_ray(child):
                    found.add((child, table[child][1]))
                todo.append(child)
    return found


def marked(entry: bytes) -> set[tuple[int, str]]:
    table = processes()
    found = set()
    for pid, (_, started) in table.items():
        if pid != os.getpid():
            try:
                if entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.add((pid, started))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return found


def kill(targets: set[tuple[int, str]]) -> int:
    """SIGKILL each (pid, start time) still running; how many were."""
    table, killed = processes(), 0
    for pid, started in targets:
        if pid in table and table[pid][1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def main(entry: bytes, fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the learner
    learner = os.getppid()
    known: set[tuple[int, str]] = set()
    while True:
        if select.select([fd], [], [], 1.0)[0] and not os.read(fd, 1):
            break
        known |= descendants(learner)
    deadline = time.monotonic() + 60  # a process may start (a worker being spawned) as others go
    quiet = 0
    while time.monotonic() < deadline and quiet < 10:
        quiet = 0 if kill(known | marked(entry)) else quiet + 1
        time.sleep(0.5)


if __name__ == "__main__" and Path("/proc").is_dir():
    main(sys.argv[1].encode(), int(sys.argv[2]))
