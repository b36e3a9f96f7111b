"""The learner side: the actors on the cluster as the learner loop's BatchSource, the weights as
its WeightSink, and ``run``."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ray
import torch

from impactrl.config import TrainConfig, ray_actor_resources
from impactrl.data.rollout import BatchAssembler, RolloutSpec
from impactrl.errors import ActorFailed
from impactrl.metrics import MetricsWriter
from impactrl.models import Agent
from impactrl.runtime.distributed import learner_actor_ids
from impactrl.runtime.learner import Learner, LearnerCounters, LearnerLink
from impactrl.runtime.learners import run_learners
from impactrl.runtime.actor import ActorProgram, ENV_ACTORS, StartArgs
from impactrl.runtime.ray.actor_side import ActorLoopFailed, RayActor, TakeReply, WeightsBoard
from impactrl.runtime.ray.cluster import cluster_room, connect, first_line, where_am_i, worker_env, write_run_info
from impactrl.runtime.ray.learners import RayLearners
from impactrl.runtime.ray.codec import (KEYFRAME_EVERY, WeightsMessage, apply_delta, delta_bound, delta_bytes,
                                        encode_delta, shipped)
from impactrl.runtime.supervision import ActorHandle, Supervision, learner_threads, supervise


class ObjectStoreWeightSink:
    """WeightSink: ``publish`` takes a copy of the weights on the learner's thread; ``latest``
    puts the newest one in the object store when a take next carries it, on the thread that
    sends the takes (the collector, runtime/prefetch.py), so the put is off the SGD thread
    and the step after a publication cannot change what is put. Several publications before
    that cost one put. With ``weight_delta`` a publication is a delta against the one before
    (every KEYFRAME_EVERY-th a full copy); ``held`` is what the actors rebuild from them, so
    lossy errors never add up.
    """

    def __init__(self, config: TrainConfig):
        self.keyframe_every = 1 if config.weight_delta == "off" else KEYFRAME_EVERY
        self.bound = delta_bound(config)
        self._lock = threading.Lock()
        # (weights, version) published since the last message; PPO may publish one version twice
        self.unshipped: tuple[dict[str, torch.Tensor], int] | None = None
        self.message: WeightsMessage | None = None
        self.held: dict[str, torch.Tensor] | None = None
        self.stats = {"publications": 0, "full_copies": 0, "bytes_full_copy": 0, "bytes_deltas": 0, "encode_s": 0.0}

    def publish(self, agent: Agent, version: int) -> None:
        state = {key: value.detach().to("cpu", copy=True) for key, value in agent.state_dict().items()}
        with self._lock:
            self.unshipped = state, version

    def publication(self) -> int:
        """The newest publication shipped to actors (0 before the first)."""
        return 0 if self.message is None else self.message.publication

    def latest(self) -> WeightsMessage:
        with self._lock:
            unshipped, self.unshipped = self.unshipped, None
        if unshipped is None:
            return self.message
        began = time.perf_counter()
        (state, version), message, stats = unshipped, self.message, self.stats
        publication = 1 if message is None else message.publication + 1
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
        self.message = WeightsMessage(version, publication, base, parts)
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


@dataclass
class RayActorHandle(ActorHandle):
    """One Ray actor: also its handle (its process may be shared: simulated actors) and its calls."""

    handle: object = None
    pending: set = field(default_factory=set)  # take calls out
    held: int = 0  # its unrolls in batches the learner has not taken yet
    last_reply: float = field(default_factory=time.monotonic)
    probe: object = None  # a silent_s call out, and when it was sent
    probe_sent: float = 0.0
    # Its process is gone (killed by the learner, or Ray reported it dead: its node left, say) and
    # no new one has reported yet; the failures of calls sent before (an older epoch) are old news.
    down_since: float | None = None
    epoch: int = 0
    stall_reported: bool = False  # the stall line of this wait for a restart is said
    incarnations: list = field(default_factory=list)  # where each of its processes ran
    last_error: str = ""


class RayActors:
    """The actors on the cluster: the learner's BatchSource, and the bookkeeping of their restarts."""

    def __init__(self, config: TrainConfig, link: LearnerLink, spec: RolloutSpec, weights: ObjectStoreWeightSink,
                 run_dir: Path, report: Callable[[str], None], program: ActorProgram = ENV_ACTORS,
                 actor_ids: list[int] | None = None):
        self.config, self.link, self.weights = config, link, weights
        rank = link.rank  # with several learners each keeps its own record of where its actors ran
        self.run_info = run_dir / ("run_info.json" if rank == 0 else f"run_info.learner-{rank}.json")
        # Those of the run's actors that feed this learner (all of them, unless there are several learners).
        self.actor_ids = list(range(config.num_actors)) if actor_ids is None else actor_ids
        self.supervision = Supervision(config, link.inbox, report)
        self.program = program
        self.in_flight = unrolls_in_flight(config)
        self.take_at_least = take_at_least(self.in_flight, len(self.actor_ids), config.slots_per_batch)
        self.spec = spec
        self.assembler = BatchAssembler(spec, config.slots_per_batch, pin_memory=link.device.type == "cuda")
        self.owner: dict = {}  # take call -> (RayActorHandle, its epoch when the call was sent)
        # PPO's actors pull each publication from a board; the rest learn it from their next take.
        self.board = None
        self.posted = 0  # the publication last posted on the board
        self.actors: list[RayActorHandle] = []
        self.learner_where = where_am_i()

    def start_all(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Create the Ray actors (Ray starts their processes; a stop requested meanwhile ends the run
        at the learner loop's first check)."""
        config = self.config
        per_process = self.program.actors_per_process
        remote = ray.remote(RayActor).options(
            num_cpus=config.ray_actor_cpus, resources=ray_actor_resources(config), max_restarts=-1,
            # every take waits in its own thread; silent_s never queues
            max_concurrency=per_process * 2 + 1,
            scheduling_strategy="SPREAD", runtime_env=worker_env(config.actor_niceness))
        if config.synchronous:
            self.board = ray.remote(WeightsBoard).options(num_cpus=0, max_concurrency=config.num_actors + 2).remote()
        for first in range(0, len(self.actor_ids), per_process):
            ids = self.actor_ids[first:first + per_process]
            handle = remote.remote(config, ids, self.spec, self.in_flight, self.board, self.program)
            self.actors += [RayActorHandle(i, generation=self.link.updates(), handle=handle) for i in ids]
        write_run_info(self.run_info, config, self.learner_where, self.actors)

    def check_health(self) -> None:
        """Hung actors are found while waiting for replies (next_batch) and Ray restarts the dead;
        here, past ``actor_stall_timeout_s``, one line about those still waiting for Ray."""
        timeout, now = self.config.actor_stall_timeout_s, time.monotonic()
        stalled = [actor for actor in self.actors
                   if actor.down_since is not None and now - actor.down_since > timeout and not actor.stall_reported]
        if not stalled:
            return
        for actor in stalled:
            actor.stall_reported = True
        longest = now - min(actor.down_since for actor in stalled)
        self.supervision.report(
            f"actors {[actor.actor_id for actor in stalled]} have waited {longest:.0f} s for Ray to restart them: "
            f"{cluster_room(self.config)}; the run goes on with the other actors (`ray status` shows the cluster)")

    def stop_all(self) -> None:
        for handle in {id(actor.handle): actor.handle for actor in self.actors}.values():
            ray.kill(handle, no_restart=True)
        if self.board is not None:
            ray.kill(self.board)
        write_run_info(self.run_info, self.config, self.learner_where, self.actors, self.weights.report())

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
                self.supervision.waited(time.monotonic() - began, self.assembler.filling, self._restarting)
                return None
        batch, meta = self.assembler.take()
        by_id = {actor.actor_id: actor for actor in self.actors}
        for actor_id in meta["slot_actor_id"].tolist():
            by_id[actor_id].held -= 1
        self.request()  # the actors go on producing while the learner trains
        self.supervision.served()
        return batch, meta

    def request(self) -> None:
        """Keep one take out per actor that has room (the learner's batches hold at most
        ``in_flight - take_at_least`` of its unrolls), for as many unrolls as fit, with the newest
        weights.

        One call at a time per actor: its reply carries every unroll the actor queued meanwhile,
        so the calls and replies per unroll fall as the learner falls behind, where several calls
        out each took the next single unroll."""
        # Put only when a take carries it: while the learner is the bottleneck about half the
        # publications reach no actor, and a put costs the learner, the raylet and the actors
        # (benchmarks/README.md, "Weights put only when a take carries them").
        weights = None
        for actor in self.actors:
            room = self.in_flight - actor.held
            if not actor.pending and room >= self.take_at_least:
                weights = weights or self.weights.latest()
                call = actor.handle.take.remote(
                    actor.actor_id, StartArgs(actor.generation, self.link.reward_stats_of(actor.actor_id),
                                              actor.received_with), weights, room)
                actor.pending.add(call)
                self.owner[call] = actor, actor.epoch
        if self.board is not None:
            weights = weights or self.weights.latest()
            if weights.publication > self.posted:
                # Waited for: Ray may drop a call whose returned reference is dropped at once.
                ray.get(self.board.post.remote(weights))
                self.posted = weights.publication

    def _receive(self, call) -> None:
        actor, epoch = self.owner.pop(call)
        actor.pending.discard(call)
        try:
            reply: TakeReply = ray.get(call)
        except ray.exceptions.RayTaskError as error:
            self._loop_failed(actor, error.cause if isinstance(error.cause, ActorLoopFailed) else None, error)
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
            # The process died (its unrolls in the object store with it): Ray restarts it, and the
            # takes sent from now on wait for the new process, which gets a new generation of seeds.
            if epoch == actor.epoch and actor.down_since is None:
                actor.last_error = first_line(error)
                self._went_down(actor)
            return
        actor.last_reply = time.monotonic()
        if reply.where is not None:
            self._started(actor, reply.where)
        for unroll in reply.unrolls:
            self.assembler.add(*unroll)
        actor.held += len(reply.unrolls)
        if reply.unrolls:  # synchronous runs: acted with the newest publication (see LocalActors._drain)
            actor.received_with = self.weights.publication()

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
                # Unanswered by an actor waiting for its restart: not hung, waiting (check_health says so).
                silent = ray.get(actor.probe) if answered else 0.0 if actor.down_since is not None else math.inf
            except ray.exceptions.RayActorError:
                silent = 0.0  # it died; Ray restarts it
            actor.probe = None
            if silent > timeout:
                actor.last_error = f"sent no heartbeat for {timeout:g} s (hung)"
                self._kill(actor)
                actor.last_reply = now  # its next process gets a whole timeout
            else:
                actor.last_reply = now - silent  # look again when its silence would reach the timeout

    def _loop_failed(self, actor: RayActorHandle, failure: ActorLoopFailed | None, error: Exception) -> None:
        trace = failure.trace if failure is not None else str(error)
        if failure is not None and failure.fatal:
            raise ActorFailed(f"actor {actor.actor_id} failed:\n{trace.rstrip()}")
        if actor.down_since is None:
            self.supervision.env_errors(failure.env_errors if failure is not None else 0)
            actor.last_error = trace.strip().splitlines()[-1]  # the exception, after its traceback
            self._kill(actor)

    def _kill(self, actor: RayActorHandle) -> None:
        """Kill the actor's process so that Ray restarts it (once: its other calls fail too)."""
        self._went_down(actor)
        ray.kill(actor.handle, no_restart=False)

    def _went_down(self, actor: RayActorHandle) -> None:
        """The actor's process is gone (``last_error`` says why), as Ray or the learner reports it:
        said and counted now, marked in run_info.json; Ray brings it back where there is room."""
        actor.down_since, actor.stall_reported = time.monotonic(), False
        actor.epoch += 1
        actor.next_generation(self.link.updates())
        if actor.incarnations and "ended_at" not in actor.incarnations[-1]:
            actor.incarnations[-1].update(ended_at=time.time(), end=actor.last_error)
        write_run_info(self.run_info, self.config, self.learner_where, self.actors)
        self.supervision.restarted(actor, f"failed ({actor.last_error})", "Ray brings it back where there is room")

    def _started(self, actor: RayActorHandle, where: dict) -> None:
        """A fresh process of ``actor`` served its first unroll."""
        generation = actor.generation  # what it started with
        if actor.incarnations and actor.down_since is None:  # its old process went unnoticed
            actor.last_error = "its process was replaced"
            self._went_down(actor)
        actor.incarnations.append({"generation": generation, **where, "started_at": time.time()})
        if len(actor.incarnations) > 1:
            self.supervision.report(f"actor {actor.actor_id}: Ray restarted it on node {where['node_id'][:12]} "
                                    f"({where['host']}, pid {where['pid']}) after "
                                    f"{time.monotonic() - actor.down_since:.0f} s")
        actor.down_since, actor.last_error = None, ""
        write_run_info(self.run_info, self.config, self.learner_where, self.actors)

    def _restarting(self) -> str:
        starting = [actor.actor_id for actor in self.actors if actor.down_since is not None]
        return (f"; actors waiting for Ray to restart them: {starting or 'none'}; is the cluster short of "
                "resources? `ray status` shows it")


def unrolls_in_flight(config: TrainConfig) -> int:
    """Unrolls per actor in the object store (and in the learner's batches): the local runtime's
    slots (each learner's), shared out among the actors (those of one learner)."""
    return math.ceil(config.effective_rollout_slots / config.actors_per_learner)


def take_at_least(in_flight: int, actors: int, slots_per_batch: int) -> int:
    """The room (in unrolls) an actor must have before a take goes out to it: half its share, so
    that while the learner is the bottleneck (the actors' queues full) each reply carries that many
    unrolls and every call's fixed cost (the learner's, the actor's, Ray's threads in both) is spread
    over them (benchmarks/README.md, "Fewer calls"). Never so much that every actor could be held
    back with no batch complete: each then holds more than ``in_flight - take_at_least`` unrolls,
    ``slots_per_batch`` in all at least."""
    return max(1, min(math.ceil(in_flight / 2), in_flight + 1 - math.ceil(slots_per_batch / actors)))


def run(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, writer: MetricsWriter,
        program: ActorProgram = ENV_ACTORS) -> LearnerCounters:
    """Start the actors (or ``synthetic`` ones) on the cluster, run the learner loop here until the
    step budget is spent."""
    # A joined cluster's actors are elsewhere: then the learner keeps torch's own thread count.
    if config.ray_address is None or config.learner_threads:
        torch.set_num_threads(learner_threads(config))
    connect(config)
    try:
        if config.num_learners > 1:
            return run_learners(config, learner, spec, run_dir, writer, program,
                                RayLearners(config, writer, run_one_learner), run_one_learner,
                                host=ray.util.get_node_ip_address())
        return run_one_learner(config, learner, spec, run_dir, writer, program)
    finally:
        ray.shutdown()  # a local instance stops with it; a joined cluster stays up


def run_one_learner(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, writer: MetricsWriter,
                    program: ActorProgram = ENV_ACTORS) -> LearnerCounters:
    """One learner (of ``learner.group``) with its share of the actors on the cluster."""
    group = learner.group
    weights = ObjectStoreWeightSink(config)
    actors = RayActors(config, learner.link(), spec, weights, run_dir, writer.message, program,
                       learner_actor_ids(config.num_actors, group.size, group.rank))
    return supervise(learner, actors, weights, run_dir, writer)
