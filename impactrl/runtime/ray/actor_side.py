"""The actor side: a Ray actor runs its ``ActorProgram`` (``run_actor``, or simulated actors) on a thread and hands
out its unrolls to the learner's ``take`` calls; weights arrive with the calls, or from the
WeightsBoard for PPO."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import traceback
from typing import NamedTuple

import numpy as np
import ray
import torch

from impactrl.config import TrainConfig
from impactrl.data.rollout import RolloutSpec, SlotStore, UnrollRecord
from impactrl.errors import EnvBroken
from impactrl.models import Agent
from impactrl.runtime.actor import ActorProgram, ENV_ACTORS, StartArgs
from impactrl.runtime.ray.cluster import where_am_i
from impactrl.runtime.ray.codec import WeightsMessage, apply_delta, delta_bound, received


class TakeReply(NamedTuple):
    where: dict | None  # the process's placement, with the first unroll it hands out
    # Every unroll queued when the call was served, oldest first (at least one, at most the take's
    # limit): one call and one object-store reply per batch of them, not per unroll. Each is
    # (arrays, record, created_at); Ray keeps a large reply in the object store.
    unrolls: list[tuple[dict[str, np.ndarray], UnrollRecord, float]]


class ActorLoopFailed(Exception):
    """The actor loop raised; ``fatal`` when restarting cannot help (EnvBroken)."""

    def __init__(self, fatal: bool, trace: str, env_errors: int = 0):
        super().__init__(trace)
        self.fatal, self.trace, self.env_errors = fatal, trace, env_errors



class ObjectStoreWeightSource:
    """WeightSource of one actor: the newest WeightsMessage the learner sent, fetched on load."""

    def __init__(self, bound: float | None):
        self.bound = bound
        self._latest: WeightsMessage | None = None
        self._arrived = threading.Condition()
        self._held: dict[str, torch.Tensor] | None = None  # the weights of publication _held_publication
        self._held_publication = 0

    def receive(self, message: WeightsMessage) -> None:
        """Keep ``message`` if it is the newest, the parts not held yet fetched now, on the take's
        thread: beside the actor loop rather than at its unroll boundary, and no ObjectRef outlives
        the take (one kept makes this process a borrower, which costs RPCs with the learner for
        every publication; benchmarks/README.md, "Weights put only when a take carries them")."""
        with self._arrived:
            latest = self._latest
            if latest is not None and message.publication <= latest.publication:
                return
            fetched = latest.parts if latest is not None and latest.base == message.base else []
        parts = fetched + received(message.parts[len(fetched):])
        with self._arrived:
            if self._latest is None or message.publication > self._latest.publication:
                self._latest = message._replace(parts=parts)
                self._arrived.notify_all()

    def publication(self) -> int:
        latest = self._latest
        return 0 if latest is None else latest.publication

    def version(self) -> int:
        """The newest version received (a synthetic actor tags its unrolls with it, loading nothing)."""
        latest = self._latest
        return -1 if latest is None else latest.version

    def load_into(self, agent: Agent) -> tuple[int, int]:
        with self._arrived:
            self._arrived.wait_for(lambda: self._latest is not None)
            message = self._latest
        if self._held is None or self._held_publication < message.base:
            full, *deltas = message.parts
            state = {key: torch.from_numpy(np.array(value)) for key, value in full.items()}
        else:
            state, deltas = self._held, message.parts[self._held_publication - message.base + 1:]
        for delta in deltas:
            state = apply_delta(state, delta, self.bound)
        self._held, self._held_publication = state, message.publication
        agent.load_state_dict(state)
        return message.version, message.publication


class ObjectStoreOutbox:
    """RolloutSink of one actor: one preallocated slot, copied out on commit (at most ``in_flight``
    copies not yet taken by the learner)."""

    def __init__(self, spec: RolloutSpec, in_flight: int, actor_id: int):
        self.actor_id = actor_id
        self.store = SlotStore(spec, 1, shared=False)
        self.space = threading.Semaphore(in_flight)  # unrolls copied out and not yet taken
        self.ready: queue.Queue = queue.Queue()
        self.beat = time.monotonic()

    def acquire(self) -> int:
        while not self.space.acquire(timeout=1.0):
            self.heartbeat()
        return 0

    def try_acquire(self) -> int | None:
        return 0 if self.space.acquire(blocking=False) else None

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        return self.store.slot_arrays(slot)

    def commit(self, slot: int, record: UnrollRecord) -> None:
        arrays = {key: value.copy() for key, value in self.store.slot_arrays(slot).items()}
        self.ready.put((arrays, record, time.time()))

    def heartbeat(self) -> None:
        self.beat = time.monotonic()


class WeightsBoard:
    """The newest WeightsMessage, posted once per publication by the learner and pulled by the
    actors that must not wait for their next take (PPO waits for each publication): the learner's
    cost of a publication does not grow with the actors. An asyncio actor: a waiting pull is a
    coroutine, not a thread."""

    def __init__(self) -> None:
        self.latest: WeightsMessage | None = None
        self.posted = asyncio.Condition()

    async def post(self, message: WeightsMessage) -> None:
        async with self.posted:
            self.latest = message
            self.posted.notify_all()

    async def newer_than(self, publication: int, timeout_s: float = 1.0) -> WeightsMessage | None:
        """The newest message once it is newer than ``publication``, or after ``timeout_s`` what
        there is (the puller asks again)."""
        async with self.posted:
            try:
                await asyncio.wait_for(self.posted.wait_for(
                    lambda: self.latest is not None and self.latest.publication > publication), timeout_s)
            except asyncio.TimeoutError:
                pass
            return self.latest


class RayActor:
    """One process of actors: its ``ActorProgram`` on a thread (``run_actor``, or several simulated
    actors replaying recorded unrolls: runtime/synthetic.py), each actor's unrolls handed out by
    ``take``.

    Weights come with every take; a synchronous (PPO) actor also pulls each new publication from
    the WeightsBoard, since its takes are all out while it waits for one."""

    def __init__(self, config: TrainConfig, actor_ids: list[int], spec: RolloutSpec, in_flight: int, board=None,
                 program: ActorProgram = ENV_ACTORS):
        self.config, self.actor_ids, self.spec = config, actor_ids, spec
        self.board, self.program = board, program
        self.weights = ObjectStoreWeightSource(delta_bound(config))
        self.outboxes = {actor_id: ObjectStoreOutbox(spec, in_flight, actor_id) for actor_id in actor_ids}
        self.failure: ActorLoopFailed | None = None
        self._lock = threading.Lock()
        self._loop: threading.Thread | None = None
        self._replied: set[int] = set()

    def _run(self, start: StartArgs) -> None:
        try:
            # Ray kills this process at the end of the run, so the loop never stops by itself.
            self.program.run(self.config, self.spec, self.actor_ids, start, self.weights, list(self.outboxes.values()),
                             lambda: False, lambda timeout: time.sleep(min(timeout, 0.001)))
        except BaseException as error:  # noqa: BLE001 - handed to the learner by take()
            self.failure = ActorLoopFailed(isinstance(error, EnvBroken), traceback.format_exc(),
                                           getattr(error, "env_errors", 0))

    # Ray records each task's state changes for its dashboard and sends them to the GCS: hundreds
    # of takes a second, in every process they touch (benchmarks/README.md, "Fewer calls").
    @ray.method(enable_task_events=False)
    def take(self, actor_id: int, start: StartArgs, weights: WeightsMessage, limit: int) -> TakeReply:
        """Up to ``limit`` unrolls actor ``actor_id`` has queued, oldest first (waiting for the
        first); the first call starts the loop with ``start``."""
        self.weights.receive(weights)
        outbox = self.outboxes[actor_id]
        with self._lock:
            if self._loop is None:
                # Until its first heartbeat the loop gets twice the timeout, for env start-up.
                for box in self.outboxes.values():
                    box.beat = time.monotonic() + self.config.actor_stall_timeout_s
                self._loop = threading.Thread(target=self._run, args=(start,), name="impactrl-actor", daemon=True)
                self._loop.start()
                if self.board is not None:
                    threading.Thread(target=self._pull, name="impactrl-weights", daemon=True).start()
        while True:
            if self.failure is not None:
                raise self.failure
            try:
                unrolls = [outbox.ready.get(timeout=1.0)]
            except queue.Empty:
                continue
            while len(unrolls) < limit:
                try:
                    unrolls.append(outbox.ready.get_nowait())
                except queue.Empty:
                    break
            for _ in unrolls:
                outbox.space.release()
            with self._lock:  # an actor's first unroll from this process tells the learner where it runs
                fresh = actor_id not in self._replied
                self._replied.add(actor_id)
            return TakeReply(where_am_i() if fresh else None, unrolls)

    def _pull(self) -> None:
        while True:
            message = ray.get(self.board.newer_than.remote(self.weights.publication()))
            if message is not None:
                self.weights.receive(message)

    def silent_s(self, actor_id: int) -> float:
        """Seconds since the actor's last heartbeat (answered by another thread than the loop's)."""
        return time.monotonic() - self.outboxes[actor_id].beat
