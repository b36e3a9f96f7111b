"""What every runtime does the same way about its actors, whatever carries their data.

- ``ActorHandle``: the learner's record of one actor that outlives its processes (its seed
  generation, its recent restarts, its last failure); each runtime extends it with its channels.
- ``Supervision``: restarts counted against the budget (``max_actor_restarts`` per
  ``actor_restart_window_s``) and reported in one line, and to the learner thread's counters
  through its ``CounterInbox``; the learner's waits for a batch, reported once they pass
  ``actor_stall_timeout_s``; what a SIGKILLed actor likely met (the OOM killer).
- ``exit_with_parent``: actor and learner processes end with the process that started them.
- ``StopRequests``: Ctrl-C, SIGTERM and SIGHUP as a flag the learner loop reads between steps.
- ``supervise``: start the actors, run the learner loop (lockstep with several learners), stop
  them, however it ends.
- ``learner_threads``: the learner's intra-op threads beside the actors.

No runtime imports another; each imports this.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import torch

from impactrl.config import TrainConfig
from impactrl.errors import ActorFailed
from impactrl.metrics import MetricsWriter
from impactrl.runtime.learner import BatchSource, CounterInbox, Learner, LearnerCounters, LearnerLoop, WeightSink
from impactrl.runtime.lockstep import LockstepLearnerLoop
from impactrl.runtime.prefetch import Prefetcher


def count_restart(config: TrainConfig, actor_id: int, recent: deque, failure: str) -> int:
    """Count a restart of ``actor_id`` against the budget (``max_actor_restarts`` within
    ``actor_restart_window_s``; ``recent`` holds the times of its restarts); ActorFailed, naming
    the actor and ``failure``, when the budget is spent. Returns its restarts in the window."""
    now = time.monotonic()
    while recent and now - recent[0] > config.actor_restart_window_s:
        recent.popleft()
    if len(recent) >= config.max_actor_restarts:
        raise ActorFailed(f"actor {actor_id} {failure}, after {len(recent)} restarts in the last "
                          f"{config.actor_restart_window_s:g} s (--max-actor-restarts {config.max_actor_restarts}, "
                          f"--actor-restart-window-s {config.actor_restart_window_s:g})")
    recent.append(now)
    return len(recent)


def exit_with_parent(parent_pid: int) -> None:
    """Linux: the kernel SIGKILLs this process when its parent dies (a SIGKILLed learner runs no
    cleanup of its own). Elsewhere the actor's parent check has to do."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before the signal was armed
        os._exit(0)


def resident_mib(pid: int) -> float | None:
    """The resident memory of ``pid`` in MiB, None where /proc cannot say."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup
    (v2's memory.events, v1's memory.oom_control; a container may show its root as /), None where
    neither is readable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidates += [f"/sys/fs/cgroup{path}/memory.events", "/sys/fs/cgroup/memory.events"]
        elif "memory" in controllers.split(","):
            candidates += [f"/sys/fs/cgroup/memory{path}/memory.oom_control", "/sys/fs/cgroup/memory/memory.oom_control"]
    for candidate in candidates:
        try:
            for entry in Path(candidate).read_text().splitlines():
                if entry.startswith("oom_kill "):
                    return int(entry.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return None


def sigkill_cause(oom_kills_before: int | None, rss_mib: float | None) -> str:
    """Why an actor was likely SIGKILLed, for its death line: the OOM killer's count, when the
    cgroup keeps one, and the memory the actor last had."""
    had = f"; it had {rss_mib:,.0f} MiB resident when last seen" if rss_mib is not None else ""
    now = oom_kills()
    if now is not None and oom_kills_before is not None:
        if now > oom_kills_before:
            return f" (the kernel's OOM killer: this cgroup's oom_kill count rose from {oom_kills_before} to {now}{had})"
        return f" (not the OOM killer, whose count in this cgroup did not rise{had})"
    return f" (SIGKILL: if nothing else sent it, likely the kernel's OOM killer; `dmesg` says{had})"


@dataclass
class ActorHandle:
    """The learner's view of one actor across its processes."""

    actor_id: int
    generation: int = -1  # of its seeds: a new process gets a new one
    restarts: deque = field(default_factory=deque)  # monotonic times of recent restarts
    last_error: str | None = None  # why its last process ended, when known
    # The publication its newest unroll to reach the learner was acted with: a restarted
    # synchronous (PPO) actor waits for a newer one rather than act with it again.
    received_with: int | None = None

    def next_generation(self, updates: int) -> int:
        """A new process's seed generation: never one used before, and past the learner's updates
        (so that a resumed run's actors do not repeat the seeds of the run before)."""
        self.generation = max(updates, self.generation + 1)
        return self.generation


class Supervision:
    """Restart budget and long-wait reports, with ``report`` (a line for the user)."""

    def __init__(self, config: TrainConfig, inbox: CounterInbox, report: Callable[[str], None]):
        self.config, self.inbox, self.report = config, inbox, report
        self.waited_s = 0.0  # in next_batch since the last batch
        self.wait_reported = False

    def restarted(self, actor: ActorHandle, failure: str, how: str, detail: str = "", trace: str = "") -> None:
        """Count a restart of ``actor``, which ``failure``, and say so: ``how`` it comes back, with
        ``detail`` (its last error line). ActorFailed, ending with ``trace``, when the budget is spent."""
        config = self.config
        try:
            restarts = count_restart(config, actor.actor_id, actor.restarts, failure)
        except ActorFailed as error:
            raise ActorFailed(f"{error}{trace}") from None
        self.inbox.restart(actor.actor_id)
        self.report(f"actor {actor.actor_id} {failure}{': ' + detail if detail else ''}; {how} with the latest "
                    f"weights ({restarts} of {config.max_actor_restarts} restarts allowed in "
                    f"{config.actor_restart_window_s:g} s)")

    def env_errors(self, count: int) -> None:
        """Env faults an actor had when it failed, which no committed unroll reported."""
        self.inbox.env_errors(count)

    def waited(self, seconds: float, filling: int, state: Callable[[], str]) -> None:
        """``next_batch`` returned nothing after ``seconds``; past the stall timeout (once per wait),
        a line that says so, with the unrolls ready and the actors' ``state``."""
        self.waited_s += seconds
        if self.waited_s > self.config.actor_stall_timeout_s and not self.wait_reported:
            self.wait_reported = True
            self.report(f"the learner has waited {self.waited_s:.0f} s for a batch ({filling} of "
                        f"{self.config.slots_per_batch} unrolls ready{state()})")

    def served(self) -> None:
        """A batch came: the next wait is a new one."""
        self.waited_s, self.wait_reported = 0.0, False


class StopRequests:
    """Ctrl-C, SIGTERM and SIGHUP (unless ignored, as under ``nohup``) while the runtime runs, as
    a flag the learner loop reads between steps.

    Python's default raises KeyboardInterrupt wherever the main thread is, which can be inside
    a multiprocessing queue's own bookkeeping: the process then hung at exit joining the
    queue's feeder thread. A second signal raises at once, for a user who will not wait for the
    current step to end; once the run is stopping (its final checkpoint, the actors' stop),
    further signals are only noted, so that nothing is cut short half written.
    """

    def __init__(self) -> None:
        self.requested = False
        self.deferred = False  # True while actors spawn and once stopping: a raise there would cut work short
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:  # nohup: keep training
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        if self.requested and not self.deferred:
            self.deferred = True  # raised once: the checkpoint and cleanup that follow are not cut short
            raise KeyboardInterrupt
        self.requested = True


class Actors(BatchSource, Protocol):
    """A runtime's actors, as ``supervise`` drives them."""

    def start_all(self, should_stop: Callable[[], bool]) -> None:
        """Start every actor, or stop starting them once ``should_stop``."""

    def check_health(self) -> None:
        """On the collector thread (runtime/prefetch.py): restart failed actors; ActorFailed when one cannot go on."""

    def stop_all(self) -> None:
        """Stop every actor started (also after a failure)."""


def supervise(learner: Learner, actors: Actors, weights: WeightSink, run_dir: Path,
              writer: MetricsWriter) -> LearnerCounters:
    """Start the actors, run the learner loop until it ends, stop them, however it ends.

    A stop requested while spawning ends the spawning; the learner loop then checkpoints and
    raises at its first check, and ``stop_all`` ends what was started. The learner loop gets its
    batches from a collector thread (runtime/prefetch.py), stopped before the actors."""
    source = Prefetcher(actors, learner.device,
                        lambda: learner.counters.env_steps < learner.config.total_env_steps)
    with StopRequests() as stops:
        def check_health() -> None:
            if stops.requested:
                stops.deferred = True  # a second signal must not cut the final checkpoint short
                raise KeyboardInterrupt  # here, between learner steps, not inside a pipe operation
            source.check_health()

        try:
            stops.deferred = True
            actors.start_all(lambda: stops.requested)
            stops.deferred = False
            loop = LearnerLoop if learner.group.size == 1 else LockstepLearnerLoop
            return loop(learner, source, weights, run_dir, writer, check_health).run()
        finally:
            stops.deferred = True
            source.stop()
            actors.stop_all()


def learner_threads(config: TrainConfig) -> int:
    """Intra-op threads for each learner: as configured, or its share of the cores the actors (one
    thread each) leave free."""
    spare = (torch.get_num_threads() or 1) - config.num_actors
    return config.learner_threads or max(1, spare // config.num_learners)
