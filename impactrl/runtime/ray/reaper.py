"""The reaper of a local Ray instance: kills what is left of it once the learner that started it is
gone, however it ended (a SIGKILLed driver runs no cleanup, and Ray's agents outlive it).

Run as a script (``python -I reaper.py MARKER FD``), importing nothing of impactrl or Ray: it
blocks on the read end FD of a pipe whose write end only the learner holds, so its end of file
means the learner is gone; then it SIGKILLs every process whose environment carries
``IMPACTRL_RAY_INSTANCE=MARKER``, which the learner set before starting the instance, so that its
servers, agents and workers, and no other process, inherited it. Linux (/proc) only; elsewhere
it does nothing.
"""

import os
import signal
import sys
import time
from pathlib import Path

VARIABLE = "IMPACTRL_RAY_INSTANCE"


def marked(entry: bytes) -> list[int]:
    pids = []
    for process in Path("/proc").iterdir():
        if process.name.isdigit() and int(process.name) != os.getpid():
            try:
                if entry in (process / "environ").read_bytes().split(b"\0"):
                    pids.append(int(process.name))
            except OSError:  # gone meanwhile, or not ours to read
                continue
    return pids


def main(marker: str, fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the learner
    while os.read(fd, 1):
        pass
    entry = f"{VARIABLE}={marker}".encode()
    deadline = time.monotonic() + 60  # a process may start (a worker the raylet was spawning) as others go
    quiet = 0
    while time.monotonic() < deadline and quiet < 4 and Path("/proc").is_dir():
        pids = marked(entry)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        quiet = 0 if pids else quiet + 1
        time.sleep(0.5)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
