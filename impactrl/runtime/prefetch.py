"""Collation off the SGD thread: a thread receives the next batch, assembles it and readies it for
the learner's device while the learner trains on the one before.

The learner loop asks its BatchSource for a batch between SGD steps; on the learner's own thread,
receiving unrolls, copying them into a batch, rebuilding stacked frames and (on CUDA) the copy to
the device all wait for the step to end, and the step waits for them. :class:`Prefetcher` runs
them on a collector thread instead, one batch ahead: the learner takes a ready batch at once.
Torch's copies and gathers release the GIL, so the thread runs beside the step even on a CPU.

The collector is the only thread that touches the runtime's actors after they started: it also
runs their health checks (restarts, hung actors), so no lock is shared with the learner's thread
and a restart never stalls a step. What it raises (an actor that cannot go on) is raised on the
learner's thread at its next call, so the run stops, checkpointed, as before. (An actor process
it restarted gets Linux's parent-death signal when the collector thread ends, not the learner
process: that is when the run stops, which stops the actors anyway.)

Nothing changes in what is trained on: batches come in the order the runtime assembles them, and
env steps count as consumed only when the learner loop takes a batch, within its step budget; the
collector stops collecting once the budget is consumed. A batch collected but not taken is lost
with the run like the unrolls still in flight (checkpoints never held those).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Protocol

import torch

from impactrl.data.rollout import Batch, restack_frames, stage_on_device


COLLECT_SLICE_S = 0.05  # the collector's longest wait inside the runtime: how soon it sees a stop or checks health
STOP_WAIT_S = 30.0  # a collector inside an actor restart finishes it first


class Actors(Protocol):
    def next_batch(self, timeout_s: float) -> tuple[Batch, dict[str, torch.Tensor]] | None: ...

    def check_health(self) -> None: ...


class Prefetcher:
    """A BatchSource over the runtime's ``actors`` whose batches a collector thread prepares, at
    most ``depth`` ahead of the learner, while ``budget_left()``; started by the first request."""

    def __init__(self, actors: Actors, device: torch.device, budget_left: Callable[[], bool], depth: int = 1):
        self.actors, self.device, self.budget_left = actors, device, budget_left
        self.ready: queue.Queue = queue.Queue()
        self.room = threading.Semaphore(depth)  # batches the collector may still prepare
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.failure: BaseException | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def next_batch(self, timeout_s: float) -> tuple[Batch, dict[str, torch.Tensor]] | None:
        """The next prepared batch, or None after ``timeout_s``."""
        self._raise_failure()
        if self.thread is None:
            self.thread = threading.Thread(target=self._collect, name="impactrl-collector", daemon=True)
            self.thread.start()
        try:
            item = self.ready.get(timeout=timeout_s) if timeout_s > 0 else self.ready.get_nowait()
        except queue.Empty:
            self._raise_failure()
            return None
        self.room.release()
        return item

    def check_health(self) -> None:
        """What the collector found is raised here; before it starts (the learner loop's first
        step), the actors are checked on this thread."""
        self._raise_failure()
        if self.thread is None:
            self.actors.check_health()

    def stop(self) -> None:
        """Stop the collector, before the actors are stopped (it is their only other user)."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=STOP_WAIT_S)

    def _raise_failure(self) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def _collect(self) -> None:
        try:
            while not self.stopping.is_set():
                self.actors.check_health()
                if not self.budget_left():
                    self.stopping.wait(COLLECT_SLICE_S)
                elif self.room.acquire(timeout=COLLECT_SLICE_S):
                    item = self._next()
                    if item is None:
                        return
                    self.ready.put((self._prepare(item[0]), item[1]))
        except BaseException as error:  # noqa: BLE001 - raised on the learner's thread
            self.failure = error

    def _next(self) -> tuple[Batch, dict[str, torch.Tensor]] | None:
        """The runtime's next batch, checking the actors' health while none comes; None once stopping."""
        while not self.stopping.is_set():
            item = self.actors.next_batch(timeout_s=COLLECT_SLICE_S)
            if item is not None:
                return item
            self.actors.check_health()
        return None

    def _prepare(self, batch: Batch) -> Batch:
        """The batch as the learner uses it: its stacked frames rebuilt, and on CUDA on its way to
        the device on a side stream, so that the copy overlaps the learner's step."""
        if self.stream is None:
            return restack_frames(batch)
        return stage_on_device(batch, self.device, self.stream)
