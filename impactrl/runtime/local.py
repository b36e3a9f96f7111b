"""The embedded local runtime: actor processes, the learner in this process, shared memory.

Data flow (the only channels there are)::

    actor --(slot index, full queue)--> learner       unroll data stays in shared SlotStore
    learner --(slot index, free queue)--> actors      a slot is free again once gathered
    learner --(SharedWeights + version)--> actors     read at unroll boundaries

Only slot indices cross process boundaries. The free queue bounds memory: when the learner
falls behind, no slot is free and actors wait in ``acquire``.
"""

from __future__ import annotations

import multiprocessing.synchronize
import queue
import signal
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp

from impactrl.config import TrainConfig
from impactrl.errors import ActorFailed
from impactrl.data.rollout import ACTOR_STAGES, SlotStore
from impactrl.metrics import MetricsWriter
from impactrl.models import Agent
from impactrl.runtime.actor import run_actor
from impactrl.runtime.learner import Learner, LearnerCounters, run_learner


class SharedWeights:
    """Learner -> actors: one shared copy of the agent's state dict and its version number.

    A lock keeps an actor from loading a half-written copy; both sides only hold it for a
    memcpy of the weights.
    """

    def __init__(self, agent: Agent, ctx: mp.context.BaseContext):
        self.tensors = {key: value.detach().cpu().clone().share_memory_() for key, value in agent.state_dict().items()}
        self._version = ctx.Value("q", -1, lock=False)
        self._lock = ctx.Lock()

    def publish(self, agent: Agent, version: int) -> None:
        # An actor killed while loading holds the lock for good. Giving up on this publish lets
        # the learner loop reach its health check, which reports the dead actor (it hung here
        # once in CI); a live actor holds the lock for one memcpy, far below the timeout.
        if not self._lock.acquire(timeout=1.0):
            return
        try:
            for key, value in agent.state_dict().items():
                self.tensors[key].copy_(value)
            self._version.value = version
        finally:
            self._lock.release()

    def version(self) -> int:
        return self._version.value

    def load_into(self, agent: Agent) -> int:
        with self._lock:
            agent.load_state_dict(self.tensors)
            return self._version.value


class SharedRollouts:
    """The slot store plus its free and full index queues."""

    def __init__(self, store: SlotStore, slots_per_batch: int, ctx: mp.context.BaseContext):
        self.store = store
        self.slots_per_batch = slots_per_batch
        self.free = ctx.Queue()
        self.full = ctx.Queue()
        # Slot indices still unsent when the learner exits are worthless (the actors are
        # stopped by then), so exit does not wait on the free queue's feeder thread.
        self.free.cancel_join_thread()
        for index in range(store.num_slots):
            self.free.put(index)
        self._gathered: list[int] = []

    def next_batch(self, timeout_s: float):
        """Learner side: wait for ``slots_per_batch`` written slots, copy them out, free them."""
        deadline = time.monotonic() + timeout_s
        while len(self._gathered) < self.slots_per_batch:
            try:
                self._gathered.append(self.full.get(timeout=max(deadline - time.monotonic(), 1e-3)))
            except queue.Empty:
                return None
        indices, self._gathered = self._gathered, []
        batch = self.store.gather(indices)
        for index in indices:
            self.free.put(index)
        return batch


class ActorEndpoint:
    """Actor side of SharedRollouts (the RolloutSink of one actor)."""

    def __init__(self, rollouts: SharedRollouts, actor_id: int, stop: multiprocessing.synchronize.Event):
        self.rollouts = rollouts
        self.actor_id = actor_id
        self.stop = stop

    def acquire(self) -> int | None:
        while not self.stop.is_set():
            try:
                return self.rollouts.free.get(timeout=0.5)
            except queue.Empty:
                continue
        return None

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        return self.rollouts.store.slot_arrays(slot)

    def commit(self, slot: int, policy_version: int, stage_seconds: dict[str, float]) -> None:
        store = self.rollouts.store
        store.actor_id[slot] = self.actor_id
        store.policy_version[slot] = policy_version
        store.created_at[slot] = time.time()
        store.stage_seconds[slot] = torch.tensor([stage_seconds[stage] for stage in ACTOR_STAGES])
        self.rollouts.full.put(slot)


def actor_process(config: TrainConfig, actor_id: int, generation: int, weights: SharedWeights,
                  rollouts: SharedRollouts, stop, errors) -> None:
    try:
        endpoint = ActorEndpoint(rollouts, actor_id, stop)
        run_actor(config, actor_id, weights, endpoint, stop.is_set, generation)
    except KeyboardInterrupt:
        pass
    except BaseException:
        errors.put((actor_id, traceback.format_exc()))
        raise SystemExit(1)


class StopRequests:
    """Ctrl-C and SIGTERM while the runtime runs, as a flag the learner loop reads between steps.

    Python's default raises KeyboardInterrupt wherever the main thread is, which can be inside
    a multiprocessing queue's own bookkeeping: the process then hung at exit joining the
    queue's feeder thread (2 of 13 stops here, one in CI). A second signal raises at once, for
    a user who will not wait for the current step to end.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def run(config: TrainConfig, learner: Learner, store: SlotStore, run_dir: Path, writer: MetricsWriter) -> LearnerCounters:
    """Start the actors, run the learner loop here until the step budget is spent, stop them."""
    with StopRequests() as stops:
        return _run(config, learner, store, run_dir, writer, stops)


def _run(config: TrainConfig, learner: Learner, store: SlotStore, run_dir: Path, writer: MetricsWriter,
         stops: StopRequests) -> LearnerCounters:
    ctx = mp.get_context("spawn")
    weights = SharedWeights(learner.agent, ctx)
    weights.publish(learner.agent, learner.counters.updates)
    rollouts = SharedRollouts(store, config.slots_per_batch, ctx)
    stop, errors = ctx.Event(), ctx.Queue()
    generation = learner.counters.updates
    actors = [
        ctx.Process(target=actor_process, name=f"impactrl-actor-{i}", daemon=True,
                    args=(config, i, generation, weights, rollouts, stop, errors))
        for i in range(config.num_actors)
    ]
    for process in actors:
        process.start()

    def check_health() -> None:
        if stops.requested:
            raise KeyboardInterrupt  # here, between learner steps, not inside a queue operation
        try:
            actor_id, trace = errors.get_nowait()
        except queue.Empty:
            pass
        else:
            raise ActorFailed(f"actor {actor_id} failed:\n{trace}")
        for i, process in enumerate(actors):
            if not process.is_alive():
                raise ActorFailed(f"actor {i} (pid {process.pid}) died with exit code {process.exitcode}")

    try:
        return run_learner(learner, rollouts, weights, run_dir, writer, check_health)
    finally:
        stop.set()
        deadline = time.monotonic() + 10.0
        for process in actors:
            process.join(timeout=max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                process.terminate()
                process.join(timeout=2.0)


def learner_threads(config: TrainConfig) -> int:
    """Intra-op threads for the learner: as configured, or the cores the actors (one thread each) leave free."""
    return config.learner_threads or max(1, (torch.get_num_threads() or 1) - config.num_actors)
