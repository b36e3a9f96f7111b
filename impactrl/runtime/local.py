"""The embedded local runtime: actor processes, the learner in this process, shared memory.

Data flow (the only channels there are)::

    actor i --(slot index, its commit pipe)--> learner        unroll data stays in the SlotStore
    learner --(slot index, actor i's return pipe)--> actor i  the slot is free again once the learner
                                                              has copied it into the batch being filled
    learner --(SharedWeights, double-buffered)--> actors      read at unroll boundaries
    actor i --(heartbeat time, shared array)--> learner       read by the supervisor

Every slot belongs to one actor (slot s to actor s mod A): memory is bounded per actor, and the
learner frees a slot as soon as it has copied it, so a restarted actor owns all its slots again.
Each pipe has one writer and one reader and every message is one atomic pipe write, so no lock
exists that a killed process could take with it (an ``mp.Queue`` reader blocks holding one, and a
SIGKILL there deadlocked every other actor). The supervisor restarts an actor that died or
stopped sending heartbeats, with a new generation of seeds, the latest weights and its reward
normalisers; a budget of restarts per actor and time window stops a run that keeps failing.
Actors exit when the learner process disappears (parent-death signal on Linux, a parent check
everywhere), so a SIGKILLed learner leaves no processes behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.multiprocessing as mp

from impactrl.config import TrainConfig
from impactrl.data.rollout import BatchAssembler, RolloutSpec, SlotStore, UnrollRecord
from impactrl.errors import ActorFailed, EnvBroken
from impactrl.metrics import MetricsWriter
from impactrl.models import Agent
from impactrl.runtime.actor import ActorProgram, ENV_ACTORS, StartArgs
from impactrl.runtime.distributed import learner_actor_ids
from impactrl.runtime.learner import Learner, LearnerCounters, LearnerLink
from impactrl.runtime.robust_lock import RobustLock
from impactrl.runtime.learners import LocalLearners, run_learners
from impactrl.runtime.supervision import (ActorHandle, Supervision, exit_with_parent, learner_threads, oom_kills,
                                         resident_mib, sigkill_cause, supervise)


STARTUP_GRACE_S = 60.0
# A SIGTERM sent to the whole process group (timeout, Slurm's scancel, kill -- -PGID) ends the
# actors at once and the learner at its next check (within about a second): an actor ended by
# SIGTERM is restarted only if the learner is still running this long after.
TERMINATED_GRACE_S = 5.0
# How often the supervisor notes each actor's memory, for the line of one the OOM killer ends.
MEMORY_SAMPLE_S = 1.0


class Stopping(Exception):
    """Raised in an actor process waiting for the weights when the run stops or the learner is gone."""


class WeightsUnreadable(RuntimeError):
    """An actor lost the race against the learner's publications for ``give_up_s`` in a row."""


READ_GIVE_UP_S = 60.0


class SharedWeights:
    """Learner -> actors: two shared copies of the agent's state dict (double buffering), which
    one holds the newest whole publication, and its version.

    Publication n is copied into buffer n % 2. Three counters say what is where: ``writing`` (the
    publication being copied, or last copied), ``published`` (the newest whole one) and each
    buffer's version. They are read and written only under ``_lock``, a robust process-shared
    mutex (runtime/robust_lock.py), held for those few integer operations and never across a
    copy; the copies themselves are plain::

        publish n:  [lock: writing = n]   copy into buffer n % 2   [lock: version, published = n]
        load:       [lock: p = published, its version]   copy buffer p % 2   [lock: w = writing]
                    the copy is whole if w < p + 2 (publication p + 2, the next one into that
                    buffer, has not begun), else it is retried

    Why this holds on any CPU, x86's strong store order or ARM's weak one: taking and giving the
    lock order memory as a mutex's acquire and release do,
    and the lock's sections happen one after another. The reader's first section comes after
    the one that set published = p, so every store of publication p's copy is visible to its
    copy, which cannot begin before that section. If its copy saw any store of publication p + 2,
    that store came after the section that set writing = p + 2, so the reader's second section,
    which its copy's loads cannot follow, comes after that one too and sees w >= p + 2.

    What a killed process leaves:

    - a learner killed mid-copy: ``published`` still names the last whole publication, in the
      other buffer, which readers keep loading; one killed inside a section: readers waiting for
      the lock keep sending heartbeats and stop once the learner is gone (``attach``);
    - an actor killed inside a section (a few microseconds of its life): the next process to
      take the lock gets it from the kernel (a robust mutex), so the learner waits no longer than
      the kill. A live holder is never let go: one stopped inside a section holds the publisher
      until the supervisor, missing its heartbeats, kills it.

    A reader loses a race only when two publications begin during its copy; it retries, sending
    heartbeats, and raises WeightsUnreadable after ``give_up_s`` of losing in a row.
    """

    def __init__(self, agent: Agent, ctx: mp.context.BaseContext):
        state = agent.state_dict()
        self.buffers = [{key: value.detach().cpu().clone().share_memory_() for key, value in state.items()}
                        for _ in range(2)]
        self._lock = RobustLock(ctx)
        self._writing = ctx.Value("q", 0, lock=False)
        self._published = ctx.Value("q", 0, lock=False)
        self._versions = ctx.Array("q", [-1, -1], lock=False)
        self.give_up_s = READ_GIVE_UP_S
        self.attach(lambda: None, lambda: False)

    def __getstate__(self) -> dict:
        """Sent to an actor process without this process's callbacks: it attaches its own."""
        return {key: value for key, value in self.__dict__.items() if key not in ("_heartbeat", "_should_stop")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.attach(lambda: None, lambda: False)

    def attach(self, heartbeat: Callable[[], None], should_stop: Callable[[], bool]) -> None:
        """In an actor process: what a reader waiting for the weights calls (it raises Stopping
        once ``should_stop``)."""
        self._heartbeat, self._should_stop = heartbeat, should_stop

    @contextlib.contextmanager
    def _section(self) -> Iterator[None]:
        while not self._lock.acquire(timeout=0.05):
            self._heartbeat()
            if self._should_stop():
                raise Stopping
        try:
            yield
        finally:
            self._lock.release()

    def publish(self, agent: Agent, version: int) -> None:
        with self._section():
            publication = self._published.value + 1
            self._writing.value = publication
        buffer = self.buffers[publication % 2]
        for key, value in agent.state_dict().items():
            buffer[key].copy_(value)
        with self._section():
            self._versions[publication % 2] = version
            self._published.value = publication

    def publication(self) -> int:
        """How many publications there were (a hint, read without the lock: load_into decides)."""
        return self._published.value

    def version(self) -> int:
        """The newest published version (a synthetic actor tags its unrolls with it, loading nothing)."""
        with self._section():
            return self._versions[self._published.value % 2] if self._published.value else -1

    def load_into(self, agent: Agent) -> tuple[int, int]:
        """The newest whole weights into ``agent`` (waiting for the first publish); (version, publication)."""
        losing_since = None
        while True:
            with self._section():
                publication = self._published.value
                version = self._versions[publication % 2]
            if not publication:
                self._idle()
                continue
            agent.load_state_dict(self.buffers[publication % 2])
            with self._section():
                whole = self._writing.value < publication + 2
            if whole:
                return version, publication
            now = time.monotonic()
            losing_since = losing_since or now
            if now - losing_since > self.give_up_s:
                raise WeightsUnreadable(
                    f"an actor could not copy the weights for {self.give_up_s:g} s: each copy was overtaken by two "
                    "publications; publish less often (--publish-interval) or give the actors more CPU")
            self._heartbeat()

    def _idle(self) -> None:
        self._heartbeat()
        if self._should_stop():
            raise Stopping
        time.sleep(0.001)


class ActorEndpoint:
    """Actor side of the runtime: the actor's own slots, its pipes and its heartbeat."""

    def __init__(self, store: SlotStore, actor_id: int, free_slots: list[int], returns: Connection,
                 commits: Connection, heartbeats: torch.Tensor, should_stop):
        self.store = store
        self.actor_id = actor_id
        self.free = deque(free_slots)
        self.returns = returns
        self.commits = commits
        self.heartbeats = heartbeats.numpy()
        self.should_stop = should_stop

    def acquire(self) -> int | None:
        while not self.free:
            self.heartbeat()
            if self.should_stop():
                return None
            try:
                if self.returns.poll(0.5):
                    self.free.append(self.returns.recv())
            except EOFError:  # the learner is gone
                return None
        return self.free.popleft()

    def try_acquire(self) -> int | None:
        """A free slot now, or None (a synthetic process serves several actors in turn)."""
        try:
            while self.returns.poll():
                self.free.append(self.returns.recv())
        except EOFError:  # the learner is gone; should_stop says so next
            pass
        return self.free.popleft() if self.free else None

    def arrays(self, slot: int) -> dict[str, np.ndarray]:
        return self.store.slot_arrays(slot)

    def commit(self, slot: int, record: UnrollRecord) -> None:
        self.store.record(slot, record, created_at=time.time())
        self.commits.send(slot)

    def heartbeat(self) -> None:
        self.heartbeats[self.actor_id] = time.monotonic()


def start_actor_process(stop, parent_pid: int, niceness: int) -> Callable[[], bool]:
    """What every actor process does first: exit with the learner, yield the cores to it by
    ``niceness``, leave Ctrl-C to it (it stops the actors); returns the process's should_stop (the
    run's stop flag, or the learner gone)."""
    exit_with_parent(parent_pid)
    os.nice(niceness)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return lambda: bool(stop.value) or os.getppid() != parent_pid


def actor_process(config: TrainConfig, program: ActorProgram, actor_ids: list[int], start: StartArgs,
                  weights: SharedWeights, store: SlotStore, slots: list[list[int]], returns: list[Connection],
                  commits: list[Connection], heartbeats: torch.Tensor, stop, parent_pid: int) -> None:
    """One actor process: ``program`` for ``actor_ids``, each with its own slots and pipes."""
    should_stop = start_actor_process(stop, parent_pid, config.actor_niceness)
    torch.set_num_threads(1)
    try:
        sinks = [ActorEndpoint(store, actor_id, own, back, out, heartbeats, should_stop)
                 for actor_id, own, back, out in zip(actor_ids, slots, returns, commits)]
        weights.attach(lambda: [sink.heartbeat() for sink in sinks], should_stop)
        program.run(config, store.spec, actor_ids, start, weights, sinks, should_stop,
                    lambda timeout: wait(returns, timeout))
    except Stopping:
        return
    except BaseException as error:
        try:
            commits[0].send(("error", isinstance(error, EnvBroken), traceback.format_exc(),
                             getattr(error, "env_errors", 0)))
        except OSError:
            pass
        raise SystemExit(1) from error


@dataclass
class LocalActorHandle(ActorHandle):
    """One local actor: also its slots, its process and its pipes."""

    slots: list[int] = field(default_factory=list)
    process: mp.Process | None = None
    commits: Connection | None = None
    returns: Connection | None = None
    fatal: bool = False  # its last failure cannot be fixed by a restart (EnvBroken)
    rss_mib: float | None = None  # its process's resident memory, sampled by check_health


class LocalActors:
    """Actor processes and their channels: the learner's BatchSource, and their supervisor."""

    def __init__(self, config: TrainConfig, link: LearnerLink, store: SlotStore, weights: SharedWeights,
                 ctx: mp.context.BaseContext, report: Callable[[str], None], program: ActorProgram = ENV_ACTORS,
                 actor_ids: list[int] | None = None):
        self.config = config
        self.program = program
        self.link = link
        self.store = store
        self.weights = weights
        self.ctx = ctx
        self.stop = ctx.Value("b", 0, lock=False)
        self.heartbeats = torch.zeros(config.num_actors, dtype=torch.float64).share_memory_()
        # Those of the run's actors that feed this learner (all of them, unless there are several
        # learners); the k-th owns slots k, k + n, ... of the n actors here.
        actor_ids = list(range(config.num_actors)) if actor_ids is None else actor_ids
        self.actors = [LocalActorHandle(i, slots=list(range(k, store.num_slots, len(actor_ids))))
                       for k, i in enumerate(actor_ids)]
        per_process = program.actors_per_process
        self.groups = [self.actors[i:i + per_process] for i in range(0, len(self.actors), per_process)]
        self.assembler = BatchAssembler(store.spec, config.slots_per_batch, pin_memory=link.device.type == "cuda")
        self.supervision = Supervision(config, link.inbox, report)
        self._terminated_at: dict[int, float] = {}  # a group's lead actor -> when it was first seen ended by SIGTERM
        self._oom_kills = oom_kills()  # to tell an OOM kill from another SIGKILL
        self._sampled_memory_at = 0.0
        self._next_turn = 0  # the position in ``actors`` of the actor read first next (_receive)

    # --- processes ----------------------------------------------------------------------------
    def start(self, group: list[LocalActorHandle]) -> None:
        """Start one process for the actors of ``group`` (one, or several simulated ones)."""
        readers, writers = [], []
        for actor in group:
            actor.next_generation(self.link.updates())
            returns_reader, actor.returns = self.ctx.Pipe(duplex=False)
            actor.commits, commits_writer = self.ctx.Pipe(duplex=False)
            readers.append(returns_reader)
            writers.append(commits_writer)
            # Until its first heartbeat an actor gets STARTUP_GRACE_S more, for imports and env start-up
            # (a loaded machine took many seconds; a short stall timeout killed actors still starting).
            self.heartbeats[actor.actor_id] = time.monotonic() + STARTUP_GRACE_S
        lead = group[0]
        start = StartArgs(lead.generation, self.link.reward_stats_of(lead.actor_id), lead.received_with)
        process = self.ctx.Process(
            target=actor_process, name=f"impactrl-actor-{lead.actor_id}", daemon=True,
            args=(self.config, self.program, [actor.actor_id for actor in group], start, self.weights, self.store,
                  [actor.slots for actor in group], readers, writers, self.heartbeats, self.stop, os.getpid()))
        process.start()
        for actor, returns_reader, commits_writer in zip(group, readers, writers):
            actor.process = process
            # Only the actor keeps these ends: its death closes the commit pipe, ours its return pipe.
            returns_reader.close()
            commits_writer.close()

    def start_all(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        for group in self.groups:
            if should_stop():  # Ctrl-C or SIGTERM while spawning: start no more
                return
            self.start(group)

    def stop_all(self) -> None:
        self.stop.value = 1
        deadline = time.monotonic() + 10.0
        for group in self.groups:
            process = group[0].process
            if process is not None:
                # One still starting (no heartbeat yet) reads the stop flag only once its imports are
                # done, many seconds on a loaded machine; it holds nothing yet, so it is killed now.
                starting = any(self.heartbeats[actor.actor_id].item() > time.monotonic() for actor in group)
                process.join(timeout=0 if starting else max(deadline - time.monotonic(), 0.1))
                if process.is_alive():
                    process.kill()
                    process.join(timeout=2.0)
            for actor in group:
                self._close_pipes(actor)

    @staticmethod
    def _close_pipes(actor: LocalActorHandle) -> None:
        for connection in (actor.commits, actor.returns):
            if connection is not None:
                connection.close()
        actor.commits = actor.returns = None

    # --- the supervisor -----------------------------------------------------------------------
    def check_health(self) -> None:
        """Restart actor processes that died or hung; ActorFailed when one cannot go on."""
        now = time.monotonic()
        timeout = self.config.actor_stall_timeout_s
        sample_memory = now - self._sampled_memory_at >= MEMORY_SAMPLE_S
        self._sampled_memory_at = now if sample_memory else self._sampled_memory_at
        for group in self.groups:
            process = group[0].process
            if not process.is_alive():
                if process.exitcode == -signal.SIGTERM and \
                        now - self._terminated_at.setdefault(group[0].actor_id, now) < TERMINATED_GRACE_S:
                    continue
                self._terminated_at.pop(group[0].actor_id, None)
                for actor in group:
                    self._drain(actor)  # what it sent before dying: committed slots, its traceback
                cause = sigkill_cause(self._oom_kills, group[0].rss_mib) if process.exitcode == -signal.SIGKILL else ""
                self._oom_kills = oom_kills()
                self._restart(group, f"died with exit code {process.exitcode}{cause}")
                continue
            if sample_memory:
                group[0].rss_mib = resident_mib(process.pid) or group[0].rss_mib
            if any(now - self.heartbeats[actor.actor_id].item() > timeout for actor in group):
                process.kill()
                process.join(timeout=5.0)
                for actor in group:
                    self._drain(actor)
                    actor.last_error = None
                self._restart(group, f"sent no heartbeat for {timeout:g} s (hung)")

    def _restart(self, group: list[LocalActorHandle], reason: str) -> None:
        actor = next((actor for actor in group if actor.last_error), group[0])
        trace = f"\n{actor.last_error.rstrip()}" if actor.last_error else ""
        if any(actor.fatal for actor in group):
            raise ActorFailed(f"actor {actor.actor_id} {reason}:{trace}")
        last_line = actor.last_error.strip().splitlines()[-1] if actor.last_error else ""
        self.supervision.restarted(actor, reason, "restarting it", last_line, f"; its last failure:{trace}" if trace else "")
        for member in group:
            self._close_pipes(member)
            member.last_error, member.rss_mib = None, None
        self.start(group)

    # --- BatchSource --------------------------------------------------------------------------
    def _drain(self, actor: ActorHandle, most: int | None = None) -> None:
        """Read the messages the actor has sent (committed slots, or a failure report): all of
        them, or at most ``most``, so that slots left unread hold the actors back while the
        learner is behind (backpressure)."""
        connection = actor.commits
        read = 0
        try:
            while connection is not None and read != most and connection.poll():
                message = connection.recv()
                read += 1
                if isinstance(message, tuple):
                    _, actor.fatal, actor.last_error, env_errors = message
                    self.supervision.env_errors(env_errors)
                else:
                    self.assembler.add(*self.store.unroll(message))
                    self._free(message)
                    # Synchronous runs publish only once every actor's unroll has arrived, so
                    # the newest publication is the one this unroll was acted with.
                    actor.received_with = self.weights.publication()
        except (EOFError, OSError):
            # It is gone and everything it sent is read; check_health restarts it. Closed now,
            # or wait() would report the pipe ready again and again until then.
            connection.close()
            actor.commits = None

    def _receive(self, timeout_s: float) -> None:
        """Read committed unrolls until a batch is complete: one from each actor with one ready in
        turn, starting after the actor read last, so that no actor's unrolls always go first
        while the others' grow old."""
        count = len(self.actors)
        order = [(self._next_turn + k) % count for k in range(count)]
        live = {self.actors[i].commits: i for i in order if self.actors[i].commits is not None}
        if not live:
            time.sleep(min(timeout_s, 0.05))
            return
        ready = set(wait(list(live), timeout=timeout_s))
        turns = deque(live[connection] for connection in live if connection in ready)
        while turns and not self.assembler:
            i = turns.popleft()
            actor = self.actors[i]
            self._drain(actor, most=1)
            self._next_turn = (i + 1) % count
            if actor.commits is not None and actor.commits.poll():
                turns.append(i)

    def next_batch(self, timeout_s: float):
        """Learner side: the next batch of ``slots_per_batch`` unrolls, each copied into it (and its
        slot freed) as it arrived; None if none is complete after ``timeout_s``."""
        began = time.monotonic()
        self._receive(0.0)
        while not self.assembler:
            remaining = began + timeout_s - time.monotonic()
            if remaining <= 0:
                self.supervision.waited(time.monotonic() - began, self.assembler.filling, self._alive)
                return None
            self._receive(remaining)
        self.supervision.served()
        return self.assembler.take()

    def _free(self, slot: int) -> None:
        owner = self.actors[slot % len(self.actors)]
        try:
            owner.returns.send(slot)
        except OSError:
            pass  # the owner died: its next generation starts with every slot the learner does not hold

    def _alive(self) -> str:
        alive = sum(actor.process.is_alive() for actor in self.actors)
        return f", {alive} of {len(self.actors)} actors alive"


def run(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, writer: MetricsWriter,
        program: ActorProgram = ENV_ACTORS) -> LearnerCounters:
    """Start the actors (or ``synthetic`` ones), run the learner loop here until the step budget
    is spent, stop them; with several learners, start the others first (``runtime/learners.py``)."""
    if config.num_learners > 1:
        return run_learners(config, learner, spec, run_dir, writer, program,
                            LocalLearners(config, writer, run_one_learner), run_one_learner)
    return run_one_learner(config, learner, spec, run_dir, writer, program)


def run_one_learner(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, writer: MetricsWriter,
                    program: ActorProgram = ENV_ACTORS) -> LearnerCounters:
    """One learner (of ``learner.group``) with its actors, its own slots and its own shared weights."""
    torch.set_num_threads(learner_threads(config))
    ctx = mp.get_context("spawn")
    store = SlotStore(spec, config.effective_rollout_slots, shared=True)
    weights = SharedWeights(learner.agent, ctx)  # actors wait for the learner loop's first publish
    group = learner.group
    actors = LocalActors(config, learner.link(), store, weights, ctx, writer.message, program,
                         learner_actor_ids(config.num_actors, group.size, group.rank))
    return supervise(learner, actors, weights, run_dir, writer)
