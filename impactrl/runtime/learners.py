"""The local runtime with ``--num-learners N``: learners 1..N-1 as processes beside learner 0.

Learner 0 is the ``impactrl train`` process. It hosts the TCP store the learners meet at, starts
the others with its own state (so all start from the same weights, optimiser and counters), then
runs like a single learner, in lockstep with them (``runtime/distributed.py``). Each learner has
its own actors (actor i feeds learner i % N), its own slots and its own shared weights: after
every step the parameters are the same everywhere, so each publishing to its own actors is
learner 0 publishing to all.

Learner 0 alone writes metrics, progress, TensorBoard and the run's checkpoints; the others send
it their lines (an actor restarted, ...), which it shows as ``learner r: ...``, and write their
own part of each checkpoint beside it (``learner.learner_part_dir``). A resume gives each its part
back; if any part is missing, every learner starts without held data, so that they stay in
lockstep, and one line says so.

A learner that dies is noticed by learner 0 before the next round (its process sentinel) or by
the collective it breaks; learner 0 then checkpoints and stops with one line naming it. The
others exit with learner 0 (the parent-death signal, as actors do), so a killed ``train`` leaves
no learner behind.
"""

from __future__ import annotations

import io
import os
import signal
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Callable, Protocol

import torch
import torch.multiprocessing as mp

from impactrl.checkpoint import checkpoint_dir, read_checkpoint
from impactrl.config import TrainConfig
from impactrl.data.rollout import RolloutSpec
from impactrl.errors import LearnerFailed, UserError
from impactrl.metrics import MetricsWriter
from impactrl.runtime.actor import ActorProgram
from impactrl.runtime.distributed import DistributedGroup, PeerStopped
from impactrl.runtime.learner import Learner, LearnerCounters, checkpoint_name, learner_part_dir
from impactrl.runtime.supervision import exit_with_parent

RunOne = Callable[..., LearnerCounters]  # a runtime's run_one_learner(config, learner, spec, run_dir, writer, program)

# How long learner 0 waits for the others to end: after a failure they checkpoint first.
EXIT_WAIT_S = 30.0


def process_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, a debugger): the one kind of hung peer the kernel names."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"


class PeerWriter:
    """A learner other than 0's stand-in for the run's MetricsWriter: its lines go to ``say``
    (which brings them to learner 0's terminal); its metrics and diagnostics are learner 0's to write."""

    def __init__(self, say: Callable[[str], None]):
        self.say = say

    def write(self, record: dict) -> None:
        pass

    def warn(self, text: str) -> None:
        pass

    def message(self, text: str) -> None:
        self.say(text)


class LocalLearners:
    """Learner 0's view of learners 1..N-1: their processes and the pipes their lines come by (a ``PeerWatch``)."""

    def __init__(self, config: TrainConfig, writer: MetricsWriter, run_one: RunOne):
        self.config, self.writer, self.run_one = config, writer, run_one
        self.processes: dict[int, mp.Process] = {}
        self.reports: dict[int, Connection] = {}
        self.errors: dict[int, str] = {}

    def start(self, host: str, port: int, learner: Learner, parts: dict[int, Path | None], run_dir: Path,
              program: ActorProgram) -> None:
        ctx = mp.get_context("spawn")
        state = state_bytes(learner)
        for rank in range(1, self.config.num_learners):
            self.reports[rank], sender = ctx.Pipe(duplex=False)
            process = ctx.Process(target=learner_process, name=f"impactrl-learner-{rank}",
                                  args=(self.config, rank, host, port, state, parts[rank], learner.learn, run_dir, program,
                                        self.run_one, sender, os.getpid()))
            process.start()
            sender.close()  # only the learner keeps it: its death closes the pipe
            self.processes[rank] = process

    def relay(self) -> None:
        """Show the others' lines; keep their failure reports for ``failure``."""
        for rank, connection in self.reports.items():
            try:
                while connection.poll():
                    kind, text = connection.recv()
                    if kind == "error":
                        self.errors[rank] = text
                    else:
                        self.writer.message(f"learner {rank}: {text}")
            except (EOFError, OSError):
                pass  # it is gone; its sentinel says how

    def check(self) -> None:
        self.relay()
        for rank, process in self.processes.items():
            if not process.is_alive():
                raise LearnerFailed(self.describe(rank))

    def failure(self, error: BaseException | None) -> BaseException:
        """The learner that ended the run: once a collective broke (``error``) the one whose process
        ended, or once one voted a failure the one that reports it (it checkpoints first)."""
        deadline = time.monotonic() + (EXIT_WAIT_S if error is None else 5.0)
        while True:
            self.relay()
            ended = [rank for rank, process in self.processes.items() if not process.is_alive()]
            failed = [rank for rank in ended if rank in self.errors or self.processes[rank].exitcode]
            if failed:
                return LearnerFailed(self.describe(failed[0]))
            if time.monotonic() > deadline or len(ended) == len(self.processes):
                reason = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else "no reply"
                silent = ", ".join(f"learner {rank} (pid {process.pid}{', stopped' if process_stopped(process.pid) else ''})"
                                   for rank, process in self.processes.items() if process.is_alive())
                return LearnerFailed(f"the learners lost contact ({reason}{'; alive but silent: ' + silent if silent else ''}); "
                                     "the run stopped with learner 0's checkpoint")
            time.sleep(0.05)

    def describe(self, rank: int) -> str:
        """One line: which learner, its pid, how it ended, its error if it sent one."""
        process = self.processes[rank]
        process.join(timeout=1.0)
        self.relay()
        code = process.exitcode
        if code is not None and code < 0:
            how = f"was killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}" if code is not None else "stopped answering"
        error = f": {self.errors[rank]}" if rank in self.errors else ""
        return f"learner {rank} (pid {process.pid}) {how}{error}; the run stopped with learner 0's checkpoint"

    def stop(self) -> None:
        """Wait for the others to end (they stop with learner 0), kill any that does not."""
        deadline = time.monotonic() + EXIT_WAIT_S
        for process in self.processes.values():
            process.join(timeout=max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                process.kill()
                process.join(timeout=5.0)
        self.relay()
        for connection in self.reports.values():
            connection.close()


def state_bytes(learner: Learner) -> bytes:
    """Learner 0's state as the others start from it."""
    buffer = io.BytesIO()
    torch.save(learner.state_dict(), buffer)
    return buffer.getvalue()


def checkpoint_parts(config: TrainConfig, learner: Learner, run_dir: Path, writer: MetricsWriter) -> dict[int, Path | None]:
    """Each other learner's part of the checkpoint learner 0 resumed from; if any is missing or
    unreadable, none (learner 0 drops its own held data too) and one line that says so."""
    fresh = {rank: None for rank in range(1, config.num_learners)}
    updates = learner.counters.updates
    if updates == 0:
        return fresh
    name = f"{checkpoint_name(updates)}.pt"
    parts = {rank: learner_part_dir(run_dir, rank) / name for rank in fresh}
    missing = []
    for rank, path in parts.items():
        try:
            read_checkpoint(path)
        except UserError:
            missing.append(rank)
    if not missing:
        return parts
    learner.drop_local_data()
    writer.message(f"no readable part of checkpoint {name} for learner {', '.join(map(str, missing))}: every learner "
                   "starts without held batches or unabsorbed observations (its buffer refills from the actors)")
    return fresh


class Peers(Protocol):
    """Learner 0's view of learners 1..N-1, whatever starts them (processes here, Ray actors on a
    cluster): a ``PeerWatch`` that can also start and stop them."""

    def start(self, host: str, port: int, learner: Learner, parts: dict[int, Path | None], run_dir: Path,
              program: ActorProgram) -> None:
        """Start learner r (1..N-1) from learner 0's state and its own checkpoint part ``parts[r]``;
        they meet at learner 0's store, ``host:port``."""

    def check(self) -> None: ...

    def failure(self, error: BaseException | None) -> BaseException: ...

    def stop(self) -> None:
        """Wait for the others to end (they stop with learner 0), end any that does not."""


def run_learners(config: TrainConfig, learner: Learner, spec: RolloutSpec, run_dir: Path, writer: MetricsWriter,
                 program: ActorProgram, peers: Peers, run_one: RunOne, host: str = "127.0.0.1") -> LearnerCounters:
    """Learner 0 here, with learners 1..N-1 started beside it by ``peers``; ``run_one`` runs one
    learner with its actors (the runtime's); see the module docstring."""
    group = DistributedGroup(0, config.num_learners, 0, learner.device, watch=peers)
    try:
        checkpoint_dir(run_dir).mkdir(exist_ok=True)  # the others write their parts inside it
        peers.start(host, group.port, learner, checkpoint_parts(config, learner, run_dir, writer), run_dir, program)
        group.join()
        learner.join(group)
        return run_one(config, learner, spec, run_dir, writer, program)
    finally:
        # Leave the group first: a learner still waiting in a collective (learner 0 failed between
        # two) then fails at once and ends, checkpointed, instead of being killed after EXIT_WAIT_S.
        group.close()
        peers.stop()


def run_other_learner(config: TrainConfig, rank: int, host: str, port: int, state: bytes, part: Path | None,
                      learn: bool, run_dir: Path, program: ActorProgram, writer, run_one: RunOne) -> None:
    """Learner ``rank`` (> 0), wherever it runs: learner 0's state, its own part of the checkpoint,
    its actors, the loop. PeerStopped when another learner ended the run."""
    from impactrl.training import build_learner

    if config.device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    learner, spec = build_learner(config, None)
    learner.load_state_dict(torch.load(io.BytesIO(state), weights_only=True, map_location=learner.device))
    if part is None:
        learner.drop_local_data()
    else:
        learner.load_local_part(Learner.local_part(read_checkpoint(part, learner.device), learner.algorithm))
    learner.learn = learn
    group = DistributedGroup(rank, config.num_learners, port, learner.device, host=host)
    group.join()
    learner.join(group)
    try:
        run_one(config, learner, spec, run_dir, writer, program)
    finally:
        group.close()


def learner_process(config: TrainConfig, rank: int, host: str, port: int, state: bytes, part: Path | None, learn: bool,
                    run_dir: Path, program: ActorProgram, run_one: RunOne, reports: Connection,
                    parent_pid: int) -> None:
    """Learner ``rank`` (> 0) as a process of the local runtime, running ``run_one`` (the local runtime's)."""
    exit_with_parent(parent_pid)
    os.setpgrp()  # out of the terminal's process group: Ctrl-C is learner 0's to handle, and it stops everyone
    try:
        writer = PeerWriter(lambda text: reports.send(("message", text)))
        run_other_learner(config, rank, host, port, state, part, learn, run_dir, program, writer, run_one)
    except PeerStopped:
        return
    except BaseException as error:  # noqa: BLE001 - whatever it was, learner 0 says it in one line
        text = str(error).strip().splitlines()
        reports.send(("error", f"{type(error).__name__}: {text[-1]}" if text else type(error).__name__))
        raise SystemExit(1) from None
