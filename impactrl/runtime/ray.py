"""The Ray runtime: actors are Ray actors anywhere on a Ray cluster, the learner is this process.

Data flow (the only channels there are)::

    actor i: run_actor on a thread of a Ray actor writes each unroll into its one preallocated
             slot; commit copies it out and queues it; at most ``in_flight`` copies not yet
             taken, then the loop waits for the learner (backpressure)
    learner -> actor i: take(start, weights)   ``in_flight`` calls out per actor, fewer while
             the learner holds unrolls of that actor it has not trained on yet
    actor i -> learner: the reply to a take: every unroll queued by then (at least one), each with
             its UnrollRecord (Ray keeps a reply over 100 KiB in the object store, owned by the
             learner); the learner copies each once, into the batch being filled
    learner -> actors: the weights, once per publication (at most every ``publish_interval``
             updates; PPO's every one), ride on take calls: an actor loads the newest one it
             has at its next unroll boundary. PPO's actors, whose takes are all out while
             they wait for a publication, pull it from a WeightsBoard the learner posts to
             once. Inline when small, else ray.put once and passed by reference (a node
             fetches it once); optionally as deltas (``weight_delta``). A publication costs
             the learner the same whatever the number of actors.

So memory is bounded whatever the speed ratio: per actor at most ``in_flight`` unrolls queued
in the actor, ``in_flight`` replies in flight and ``in_flight`` in the learner's batches.

Faults are Ray's to repair: actors are created with ``max_restarts=-1``, so Ray restarts a
killed worker (or an actor whose node left the cluster, on a node that has room) in a fresh
process. The learner sees the take calls fail, sends new ones (they wait for the restart), and
the new process starts its loop with the start arguments and the newest weights its first take
carries; its reply says it is fresh, which is counted in ``actor_restarts`` against the same
budget as the local runtime (``max_actor_restarts`` per ``actor_restart_window_s``). An actor loop
that raises is killed so that Ray restarts it, except on EnvBroken, which stops the run.
Actors are owned by this process: Ray stops them when it exits, however it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import queue
import socket
import threading
import time
import traceback
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np
import torch

from impactrl.config import TrainConfig, ray_actor_resources
from impactrl.data.rollout import BatchAssembler, RolloutSpec, SlotStore, UnrollRecord
from impactrl.errors import ActorFailed, EnvBroken, UserError
from impactrl.metrics import MetricsWriter
from impactrl.models import Agent
from impactrl.runtime.actor import run_actor
from impactrl.runtime.synthetic import Synthetic, record_unrolls, replay
from impactrl.runtime.learner import Learner, LearnerCounters, count_restart, run_learner
from impactrl.runtime.local import StopRequests, learner_threads

try:
    import ray
except ImportError:  # an optional extra: preflight says how to install it
    ray = None


class WeightsMessage(NamedTuple):
    """The newest weights as actors receive them: a full copy (publication ``base``), then the
    deltas up to ``publication``, each the payload itself when small (it travels inside the call)
    or its ObjectRef (put once; an actor fetches it at an unroll boundary, and only what it lacks)."""

    version: int
    publication: int
    base: int
    parts: list


class StartArgs(NamedTuple):
    """What a fresh actor process starts its loop with (used by the first take it serves)."""

    generation: int
    reward_stats: np.ndarray | None


class TakeReply(NamedTuple):
    where: dict | None  # the process's placement, with the first unroll it hands out
    # Every unroll queued when the call was served (at least one, at most in_flight): fewer,
    # bigger replies. Each is (arrays, record, created_at); Ray keeps a large reply in the object store.
    unrolls: list[tuple[dict[str, np.ndarray], UnrollRecord, float]]


# Ray starts its workers at niceness +15 (for its own servers' sake): beside any other busy
# process an actor then gets almost no CPU. Actors run at the niceness of the node's Ray
# processes instead, as the local runtime's do (benchmarks/README.md measures both).
ACTOR_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}

# Ray passes smaller values inside a call (its max_direct_call_object_size); larger weights are
# put in the object store once and passed by reference. A put costs ~1 ms however small.
INLINE_BYTES = 100 * 1024


def shipped(payload, size: int):
    return payload if size < INLINE_BYTES else ray.put(payload)


def received(parts: list) -> list:
    refs = [part for part in parts if isinstance(part, ray.ObjectRef)]
    fetched = dict(zip(refs, ray.get(refs)))
    return [fetched[part] if isinstance(part, ray.ObjectRef) else part for part in parts]


class ActorLoopFailed(Exception):
    """The actor loop raised; ``fatal`` when restarting cannot help (EnvBroken)."""

    def __init__(self, fatal: bool, trace: str):
        super().__init__(trace)
        self.fatal, self.trace = fatal, trace


# --- weight deltas ----------------------------------------------------------------------------
# Publications per full copy with --weight-delta: a fresh actor fetches one copy and at most 15 deltas.
KEYFRAME_EVERY = 16
SAME_WIDTH_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
                  torch.bfloat16: torch.int16}


def _zipped(tensor: torch.Tensor) -> tuple[bytes, bytes]:
    """The bytes of a delta by significance: the high half (mostly zeros: sign, exponent, top of
    the mantissa, or the top of a small integer) through zlib; the low half, nearly random, as it is."""
    width = tensor.element_size()
    planes = tensor.contiguous().numpy().view(np.uint8).reshape(-1, width).T
    low = width // 2
    return planes[:low].tobytes(), zlib.compress(planes[low:].tobytes(), 1)


def _unzipped(data: tuple[bytes, bytes], dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    width = torch.empty((), dtype=dtype).element_size()
    planes = np.frombuffer(data[0] + zlib.decompress(data[1]), np.uint8).reshape(width, -1)
    return torch.from_numpy(planes.T.copy()).view(dtype).reshape(shape)


def encode_delta(new: dict[str, torch.Tensor], held: dict[str, torch.Tensor], bound: float | None) -> dict:
    """What turns ``held`` into ``new``: per float tensor the XOR of the bit patterns (exact), or
    with ``bound`` the difference in steps of 2 * bound (within bound, up to float rounding);
    anything else whole. ``apply_delta`` undoes it."""
    delta = {}
    for key, value in new.items():
        if bound is not None and value.dtype == torch.float32:
            steps = torch.round((value - held[key]) / (2 * bound))
            peak = steps.abs().max().item() if steps.numel() else 0
            dtype = next((t for t, top in ((torch.int8, 2**7), (torch.int16, 2**15), (torch.int32, 2**31)) if peak < top), None)
            delta[key] = ("steps", dtype, _zipped(steps.to(dtype))) if dtype is not None else ("whole", value.clone())
        elif value.dtype in SAME_WIDTH_INT:
            bits = SAME_WIDTH_INT[value.dtype]
            delta[key] = ("xor", bits, _zipped(value.view(bits) ^ held[key].view(bits)))
        else:
            delta[key] = ("whole", value.clone())
    return delta


def apply_delta(held: dict[str, torch.Tensor], delta: dict, bound: float | None) -> dict[str, torch.Tensor]:
    new = {}
    for key, (kind, *payload) in delta.items():
        old = held[key]
        if kind == "steps":
            new[key] = old + _unzipped(payload[1], payload[0], old.shape).to(old.dtype) * (2 * bound)
        elif kind == "xor":
            new[key] = (old.view(payload[0]) ^ _unzipped(payload[1], payload[0], old.shape)).view(old.dtype)
        else:
            new[key] = payload[0]
    return new


def delta_bytes(delta: dict) -> int:
    return sum(sum(map(len, payload[-1])) if kind != "whole" else payload[0].nbytes for kind, *payload in delta.values())


@contextlib.contextmanager
def two_node_cluster(node_cpus: int) -> Iterator[str]:
    """The address of a Ray cluster of two nodes simulated on this machine, each promising
    ``node_cpus`` CPUs, shut down afterwards: the multi-node path without a second machine."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": node_cpus})
    try:
        cluster.add_node(num_cpus=node_cpus)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def where_am_i() -> dict:
    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


# --- the actor side ---------------------------------------------------------------------------
class ObjectStoreWeightSource:
    """WeightSource of one actor: the newest WeightsMessage the learner sent, fetched on load."""

    def __init__(self, bound: float | None):
        self.bound = bound
        self._latest: WeightsMessage | None = None
        self._arrived = threading.Condition()
        self._held: dict[str, torch.Tensor] | None = None  # the weights of publication _held_publication
        self._held_publication = 0

    def receive(self, message: WeightsMessage) -> None:
        with self._arrived:
            if self._latest is None or message.publication > self._latest.publication:
                self._latest = message
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
            full, *deltas = received(message.parts)
            state = {key: torch.from_numpy(np.array(value)) for key, value in full.items()}
        else:
            state, deltas = self._held, received(message.parts[self._held_publication - message.base + 1:])
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
    """One process of actors: ``run_actor`` on a thread (or, with ``synthetic``, several simulated
    actors replaying recorded unrolls: runtime/synthetic.py), each actor's unrolls handed out by
    ``take``.

    Weights come with every take; a synchronous (PPO) actor also pulls each new publication from
    the WeightsBoard, since its takes are all out while it waits for one."""

    def __init__(self, config: TrainConfig, actor_ids: list[int], spec: RolloutSpec, in_flight: int, board=None,
                 synthetic: Synthetic | None = None):
        self.config, self.actor_ids, self.spec = config, actor_ids, spec
        self.board, self.synthetic = board, synthetic
        self.weights = ObjectStoreWeightSource(delta_bound(config))
        self.outboxes = {actor_id: ObjectStoreOutbox(spec, in_flight, actor_id) for actor_id in actor_ids}
        self.failure: ActorLoopFailed | None = None
        self._lock = threading.Lock()
        self._loop: threading.Thread | None = None
        self._replied: set[int] = set()

    def _run(self, start: StartArgs) -> None:
        try:
            # Ray kills this process at the end of the run, so the loop never stops by itself.
            if self.synthetic is None:
                run_actor(self.config, self.actor_ids[0], self.weights, self.outboxes[self.actor_ids[0]], lambda: False,
                          start.generation, start.reward_stats)
            else:
                recorded, reward_stats = record_unrolls(self.config, self.spec, self.actor_ids[0], start.generation,
                                                        self.weights, self.synthetic.recorded_unrolls)
                replay(recorded, reward_stats, list(self.outboxes.values()), self.weights.version, lambda: False,
                       lambda timeout: time.sleep(min(timeout, 0.001)))
        except BaseException as error:  # noqa: BLE001 - handed to the learner by take()
            self.failure = ActorLoopFailed(isinstance(error, EnvBroken), traceback.format_exc())

    def take(self, actor_id: int, start: StartArgs, weights: WeightsMessage) -> TakeReply:
        """The next unroll actor ``actor_id`` puts (waiting for it); the first call starts the loop with ``start``."""
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
            while True:
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


# --- the learner side -------------------------------------------------------------------------
class ObjectStoreWeightSink:
    """WeightSink: remembers the newest publication; ``latest`` puts it in the object store when due.

    The put happens when the learner next asks actors for data, which run_learner does only with
    the agent exactly as last published (after an update that published, or before the first):
    an update that nobody reads costs no copy. With ``weight_delta`` a publication is a delta
    against the one before (every KEYFRAME_EVERY-th a full copy); ``held`` is what the actors
    rebuild from them, so lossy errors never add up.
    """

    def __init__(self, config: TrainConfig):
        self.keyframe_every = 1 if config.weight_delta == "off" else KEYFRAME_EVERY
        self.bound = delta_bound(config)
        self.agent: Agent | None = None
        self.version = -1
        self.unshipped = False  # a publish since the last message; PPO may publish one version twice
        self.message: WeightsMessage | None = None
        self.held: dict[str, torch.Tensor] | None = None
        self.stats = {"publications": 0, "full_copies": 0, "bytes_full_copy": 0, "bytes_deltas": 0, "encode_s": 0.0}

    def publish(self, agent: Agent, version: int) -> None:
        self.agent, self.version, self.unshipped = agent, version, True

    def latest(self) -> WeightsMessage:
        message = self.message
        if self.unshipped:
            self.unshipped = False
            began = time.perf_counter()
            state = {key: value.detach().cpu().clone() for key, value in self.agent.state_dict().items()}
            publication = 1 if message is None else message.publication + 1
            stats = self.stats
            if (publication - 1) % self.keyframe_every == 0:
                base, parts, self.held = publication, [], state
                size = stats["bytes_full_copy"] = sum(value.nbytes for value in state.values())
                payload = {key: value.numpy() for key, value in state.items()}
                stats["full_copies"] += 1
            else:
                base, parts = message.base, list(message.parts)
                payload = encode_delta(state, self.held, self.bound)
                self.held = apply_delta(self.held, payload, self.bound)
                size = delta_bytes(payload)
                stats["bytes_deltas"] += size
            parts.append(shipped(payload, size))
            self.message = WeightsMessage(self.version, publication, base, parts)
            stats["publications"] += 1
            stats["encode_s"] += time.perf_counter() - began
        return self.message

    def report(self) -> dict:
        """Bytes per broadcast, for run_info.json."""
        stats = self.stats
        deltas = stats["publications"] - stats["full_copies"]
        return {"weight_delta": "off" if self.keyframe_every == 1 else "lossless" if self.bound is None else "lossy",
                "delta_bound": self.bound, "publications": stats["publications"],
                "bytes_full_copy": stats["bytes_full_copy"],
                "bytes_per_delta": stats["bytes_deltas"] / deltas if deltas else None,
                "bytes_per_publication": ((stats["full_copies"] * stats["bytes_full_copy"] + stats["bytes_deltas"])
                                          / max(stats["publications"], 1)),
                "put_ms_per_publication": 1000 * stats["encode_s"] / max(stats["publications"], 1)}


def delta_bound(config: TrainConfig) -> float | None:
    return config.weight_delta_bound if config.weight_delta == "lossy" else None


@dataclass
class ActorHandle:
    """The learner's view of one Ray actor."""

    actor_id: int
    handle: object
    generation: int
    pending: set = field(default_factory=set)  # take calls out
    held: int = 0  # its unrolls in batches the learner has not taken yet
    last_reply: float = field(default_factory=time.monotonic)
    probe: object = None  # a silent_s call out, and when it was sent
    probe_sent: float = 0.0
    killed: bool = False  # by the learner; until its next process reports, its old calls' failures are old news
    incarnations: list = field(default_factory=list)  # where each of its processes ran
    restarts: deque = field(default_factory=deque)  # monotonic times of recent restarts
    last_error: str = ""


class RayActors:
    """The actors on the cluster: the learner's BatchSource, and the bookkeeping of their restarts."""

    def __init__(self, config: TrainConfig, learner: Learner, spec: RolloutSpec, weights: ObjectStoreWeightSink,
                 run_dir: Path, report: Callable[[str], None], synthetic: Synthetic | None = None):
        self.config, self.learner, self.weights, self.run_dir = config, learner, weights, run_dir
        self.report = report  # a line for the user: restarts, long waits
        self.in_flight = unrolls_in_flight(config)
        self.assembler = BatchAssembler(spec, config.slots_per_batch, pin_memory=learner.device.type == "cuda")
        self.owner: dict = {}  # take call -> ActorHandle
        per_process = 1 if synthetic is None else synthetic.actors_per_process
        remote = ray.remote(RayActor).options(
            num_cpus=config.ray_actor_cpus, resources=ray_actor_resources(config), max_restarts=-1,
            # every take waits in its own thread; silent_s never queues
            max_concurrency=per_process * (self.in_flight + 1) + 1,
            scheduling_strategy="SPREAD", runtime_env=ACTOR_RUNTIME_ENV)
        # PPO's actors pull each publication from a board; the rest learn it from their next take.
        self.board = (ray.remote(WeightsBoard).options(num_cpus=0, max_concurrency=config.num_actors + 2).remote()
                      if config.synchronous else None)
        self.posted = 0  # the publication last posted on the board
        self.actors = []
        for first in range(0, config.num_actors, per_process):
            ids = list(range(first, min(first + per_process, config.num_actors)))
            handle = remote.remote(config, ids, spec, self.in_flight, self.board, synthetic)
            self.actors += [ActorHandle(i, handle, learner.counters.updates) for i in ids]
        self.learner_where = where_am_i()
        self.waited_s = 0.0
        self.wait_reported = False

    def stop_all(self) -> None:
        for handle in {id(actor.handle): actor.handle for actor in self.actors}.values():
            ray.kill(handle, no_restart=True)
        if self.board is not None:
            ray.kill(self.board)

    # --- BatchSource --------------------------------------------------------------------------
    def next_batch(self, timeout_s: float):
        """The next batch of ``slots_per_batch`` unrolls, each copied into it as its reply came;
        None if none is complete after ``timeout_s``."""
        began = time.monotonic()
        while not self.assembler:
            self.request()
            remaining = began + timeout_s - time.monotonic()
            calls = list(self.owner)
            # Collected once even when the time is up, so that timeout_s = 0 takes what has arrived.
            done, rest = ray.wait(calls, num_returns=1, timeout=max(remaining, 0.0))
            if done:
                done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for call in done:
                self._receive(call)
            self._find_hung()
            if not self.assembler and time.monotonic() >= began + timeout_s:
                self.waited_s += time.monotonic() - began
                self._report_long_wait()
                return None
        batch, meta = self.assembler.take()
        for actor_id in meta["slot_actor_id"].tolist():
            self.actors[actor_id].held -= 1
        self.request()  # the actors go on producing while the learner trains
        self.waited_s, self.wait_reported = 0.0, False
        return batch, meta

    def request(self) -> None:
        """Keep ``in_flight`` takes out per actor, and the newest weights with every actor."""
        weights = self.weights.latest()
        for actor in self.actors:
            while len(actor.pending) + actor.held < self.in_flight:
                call = actor.handle.take.remote(
                    actor.actor_id, StartArgs(actor.generation, self.learner.reward_stats_of(actor.actor_id)), weights)
                actor.pending.add(call)
                self.owner[call] = actor
        if self.board is not None and weights.publication > self.posted:
            # Waited for: a post whose reference was dropped at once was lost in about one run in four.
            ray.get(self.board.post.remote(weights))
            self.posted = weights.publication

    def _receive(self, call) -> None:
        actor = self.owner.pop(call)
        actor.pending.discard(call)
        try:
            reply: TakeReply = ray.get(call)
        except ray.exceptions.RayTaskError as error:
            self._loop_failed(actor, error.cause if isinstance(error.cause, ActorLoopFailed) else None, error)
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
            # The process died (its unrolls in the object store with it): Ray restarts it, and the
            # takes sent from now on wait for the new process, which gets a new generation of seeds.
            # Keep a reason already known (a hang found, a loop that raised) over Ray's report of the kill.
            actor.last_error = actor.last_error or first_line(error)
            actor.generation = max(self.learner.counters.updates, actor.generation + 1)
            return
        actor.last_reply = time.monotonic()
        if reply.where is not None:
            actor.killed = False
            self._started(actor, reply.where)
        for unroll in reply.unrolls:
            self.assembler.add(*unroll)
        actor.held += len(reply.unrolls)

    def _find_hung(self) -> None:
        """Kill actors that sent nothing for ``actor_stall_timeout_s`` while asked, and whose loop
        (or whole process: then the probe goes unanswered) has been silent as long; Ray restarts them."""
        timeout, now = self.config.actor_stall_timeout_s, time.monotonic()
        for actor in self.actors:
            if not actor.pending or now - actor.last_reply < timeout:
                continue
            if actor.probe is None:
                actor.probe, actor.probe_sent = actor.handle.silent_s.remote(actor.actor_id), now
                continue
            answered = ray.wait([actor.probe], timeout=0)[0]
            if not answered and now - actor.probe_sent < timeout:
                continue
            try:
                silent = ray.get(actor.probe) if answered else math.inf
            except ray.exceptions.RayActorError:
                silent = 0.0  # it died; Ray restarts it
            actor.probe = None
            if silent > timeout:
                actor.last_error = f"sent no heartbeat for {timeout:g} s (hung)"
                self._kill(actor)
                actor.last_reply = now  # its next process gets a whole timeout
            else:
                actor.last_reply = now - silent  # look again when its silence would reach the timeout

    def _loop_failed(self, actor: ActorHandle, failure: ActorLoopFailed | None, error: Exception) -> None:
        trace = failure.trace if failure is not None else str(error)
        if failure is not None and failure.fatal:
            raise ActorFailed(f"actor {actor.actor_id} failed:\n{trace.rstrip()}")
        if not actor.killed:
            actor.last_error = trace.strip().splitlines()[-1]  # the exception, after its traceback
            self._kill(actor)

    def _kill(self, actor: ActorHandle) -> None:
        """Kill the actor's process so that Ray restarts it (once: its other calls fail too)."""
        actor.killed = True
        actor.generation = max(self.learner.counters.updates, actor.generation + 1)
        ray.kill(actor.handle, no_restart=False)

    def _started(self, actor: ActorHandle, where: dict) -> None:
        """A fresh process of ``actor`` served its first unroll: a restart unless it is the first."""
        actor.incarnations.append({"generation": actor.generation, **where, "started_at": time.time()})
        if len(actor.incarnations) > 1:
            self._count_restart(actor, where)
        write_run_info(self.run_dir, self.config, self.learner_where, self.actors)

    def _count_restart(self, actor: ActorHandle, where: dict) -> None:
        config = self.config
        reason = actor.last_error or "its process was replaced"
        restarts = count_restart(config, self.learner.counters, actor.actor_id, actor.restarts, f"failed ({reason})")
        self.report(f"actor {actor.actor_id} failed ({reason}); Ray restarted it on node {where['node_id'][:12]} "
                    f"({where['host']}, pid {where['pid']}) with the latest weights ({restarts} of "
                    f"{config.max_actor_restarts} restarts allowed in {config.actor_restart_window_s:g} s)")
        actor.last_error = ""

    def _report_long_wait(self) -> None:
        if self.waited_s > self.config.actor_stall_timeout_s and not self.wait_reported:
            self.wait_reported = True
            starting = [actor.actor_id for actor in self.actors if actor.last_error]
            self.report(f"the learner has waited {self.waited_s:.0f} s for a batch ({self.assembler.filling} of "
                        f"{self.config.slots_per_batch} unrolls ready; actors waiting for Ray to restart them: "
                        f"{starting or 'none'}; is the cluster short of resources? `ray status` shows it)")


def unrolls_in_flight(config: TrainConfig) -> int:
    """Unrolls per actor in the object store (and in the learner's batches): the local runtime's
    slots, shared out among the actors."""
    return math.ceil(config.num_slots / config.num_actors)


def write_run_info(run_dir: Path, config: TrainConfig, learner: dict, actors: list[ActorHandle],
                   weights: dict | None = None) -> None:
    """``RUN_DIR/run_info.json``: where the learner and every process of every actor ran (newest
    last); at the end also what the weight broadcasts cost."""
    info = {"runtime": "ray", "ray_address": config.ray_address, "learner": learner,
            "actors": {str(actor.actor_id): actor.incarnations for actor in actors},
            **({"weights": weights} if weights is not None else {})}
    partial = run_dir / ".run_info.json.partial"
    partial.write_text(json.dumps(info, indent=1))
    partial.replace(run_dir / "run_info.json")


# --- connecting -------------------------------------------------------------------------------
def preflight(config: TrainConfig) -> None:
    """Before anything starts: Ray is installed, the cluster answers and can hold the actors."""
    if ray is None:
        raise UserError('--runtime ray needs Ray: pip install -e ".[ray]" (or pip install "ray>=2.60")')
    need = {"CPU": config.ray_actor_cpus, **ray_actor_resources(config)}
    if config.ray_address is None:
        custom = sorted(name for name in need if name != "CPU")
        if custom:
            raise UserError(f"--ray-actor-resources {', '.join(custom)}: a local Ray instance has no such resource; "
                            "join a cluster whose nodes offer it with --ray-address")
        return
    if config.ray_address != "auto":
        host, _, port = config.ray_address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5.0).close()
        except OSError as error:
            raise UserError(f"--ray-address {config.ray_address}: nothing answers there ({error.strerror or error}); "
                            "start the head with `ray start --head` and pass the address it prints") from None
    try:
        ray.init(address=config.ray_address, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise UserError(f"--ray-address {config.ray_address}: cannot join the Ray cluster: {first_line(error)}") from None
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    capacity = sum(min((math.floor(node.get(name, 0.0) / amount + 1e-9) for name, amount in need.items() if amount > 0),
                       default=config.num_actors) for node in nodes)
    if capacity < config.num_actors:
        ray.shutdown()
        asked = ", ".join(f"{name}={amount:g}" for name, amount in need.items())
        raise UserError(f"--ray-address {config.ray_address}: the cluster's {len(nodes)} node(s) can hold {capacity} "
                        f"actor(s) asking for {asked} each, not --num-actors {config.num_actors}; lower "
                        "--ray-actor-cpus or --num-actors, or add nodes")


def connect(config: TrainConfig) -> None:
    """Join the cluster (preflight may have already), or start a local instance sized for the run:
    its CPU count is a scheduling promise, so actors may outnumber cores as in the local runtime."""
    if ray.is_initialized():
        return
    if config.ray_address is not None:
        ray.init(address=config.ray_address, logging_level=logging.WARNING)
        return
    cpus = max(os.cpu_count() or 1, math.ceil(config.num_actors * config.ray_actor_cpus))
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)


def run(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, writer: MetricsWriter,
        synthetic: Synthetic | None = None) -> LearnerCounters:
    """Start the actors (or ``synthetic`` ones) on the cluster, run the learner loop here until the
    step budget is spent."""
    # A joined cluster's actors are elsewhere: then the learner keeps torch's own thread count.
    if config.ray_address is None or config.learner_threads:
        torch.set_num_threads(learner_threads(config))
    connect(config)
    try:
        weights = ObjectStoreWeightSink(config)
        actors = RayActors(config, learner, spec, weights, run_dir, writer.message, synthetic)
        write_run_info(run_dir, config, actors.learner_where, actors.actors)
        with StopRequests() as stops:
            def check_health() -> None:
                if stops.requested:
                    raise KeyboardInterrupt

            try:
                return run_learner(learner, actors, weights, run_dir, writer, check_health)
            finally:
                actors.stop_all()
                write_run_info(run_dir, config, actors.learner_where, actors.actors, weights.report())
    finally:
        ray.shutdown()  # a local instance stops with it; a joined cluster stays up
