"""The Ray runtime with ``--num-learners N``: learners 1..N-1 as Ray actors, placed by resources.

As on the local runtime (``runtime/learners.py``), learner 0 is the ``impactrl train`` process: it
hosts the TCP store the learners meet at (on its node's address), starts the others from its own
state and runs in lockstep with them. Each learner here is a Ray actor that asks Ray for
``--learner-resources`` (``GPU=1``, ``CPU=4``, a custom resource; one CPU by default), so Ray puts
it on a node that has them; it then starts its own share of the run's actors on the cluster and
runs ``run_one_learner`` like learner 0. Their lines reach this terminal through Ray's log
forwarding, prefixed with the learner. Their checkpoint parts go under the run directory, which
must therefore be on a filesystem every learner's node sees.

A learner actor that dies (its process killed, its node lost) ends its ``run`` call with an
error; learner 0 notices it before its next round, or when the collective it breaks raises,
checkpoints, and stops with one line naming the learner, its node and pid, and how it ended.
"""

from __future__ import annotations

from pathlib import Path

import ray

from impactrl.config import TrainConfig, learner_resources
from impactrl.errors import LearnerFailed
from impactrl.metrics import MetricsWriter
from impactrl.runtime.actor import ActorProgram
from impactrl.runtime.distributed import PeerStopped
from impactrl.runtime.learner import Learner
from impactrl.runtime.learners import EXIT_WAIT_S, PeerWriter, RunOne, run_other_learner, state_bytes
from impactrl.runtime.ray.cluster import first_line, where_am_i, worker_env


PLACE_TIMEOUT_S = 120.0  # for Ray to start the learner actors (a node with the resources free)


class RemoteLearner:
    """Learner ``rank`` > 0 as a Ray actor."""

    def where(self) -> dict:
        return where_am_i()

    def run(self, config: TrainConfig, rank: int, host: str, port: int, state: bytes, part: Path | None,
            learn: bool, run_dir: Path, program: ActorProgram, run_one_learner: RunOne) -> None:
        try:
            # Its lines go to its stdout, which Ray forwards to learner 0's terminal.
            writer = PeerWriter(lambda text: print(f"learner {rank}: {text}", flush=True))
            run_other_learner(config, rank, host, port, state, part, learn, run_dir, program, writer, run_one_learner)
        except PeerStopped:
            return


class RayLearners:
    """Learner 0's view of learners 1..N-1 on the cluster (a ``learners.Peers``)."""

    def __init__(self, config: TrainConfig, writer: MetricsWriter, run_one: RunOne):
        self.config, self.writer, self.run_one = config, writer, run_one  # run_one: the Ray runtime's
        self.handles: dict[int, object] = {}
        self.places: dict[int, dict] = {}
        self.runs: dict[int, object] = {}  # rank -> its run call

    def start(self, host: str, port: int, learner: Learner, parts: dict[int, Path | None], run_dir: Path,
              program: ActorProgram) -> None:
        resources = learner_resources(self.config)
        remote = ray.remote(RemoteLearner).options(
            num_cpus=resources.pop("CPU", 1.0), num_gpus=resources.pop("GPU", 0.0), resources=resources,
            # a restarted learner would have lost its place in the lockstep: the run stops
            runtime_env=worker_env(0), max_restarts=0)
        state = ray.put(state_bytes(learner))
        self.handles = {rank: remote.remote() for rank in range(1, self.config.num_learners)}
        # Placed first (an actor serves one call at a time, and run returns only at the end): where
        # each runs, for the line if it fails.
        try:
            places = ray.get([handle.where.remote() for handle in self.handles.values()], timeout=PLACE_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            asked = ", ".join(f"{name}={amount:g}" for name, amount in learner_resources(self.config).items())
            raise LearnerFailed(f"Ray placed no learner asking for {asked} within {PLACE_TIMEOUT_S:.0f} s: no node has "
                                "that free (`ray status` shows the cluster); change --learner-resources") from None
        self.places = dict(zip(self.handles, places))
        for rank, handle in self.handles.items():
            self.runs[rank] = handle.run.remote(self.config, rank, host, port, state, parts[rank], learner.learn,
                                                run_dir, program, self.run_one)

    def check(self) -> None:
        ended, _ = ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=0)
        if ended:
            raise LearnerFailed(self.describe(self.rank_of(ended[0])))

    def failure(self, error: BaseException | None) -> BaseException:
        """The learner whose call ended (it failed, or lost contact), waiting a little for it."""
        ended, _ = ray.wait(list(self.runs.values()), num_returns=1, timeout=5.0 if error is not None else EXIT_WAIT_S)
        if ended:
            return LearnerFailed(self.describe(self.rank_of(ended[0])))
        reason = first_line(error) if error is not None else "no reply"
        return LearnerFailed(f"the learners lost contact ({reason}); the run stopped with learner 0's checkpoint")

    def rank_of(self, call) -> int:
        return next(rank for rank, run in self.runs.items() if run == call)

    def describe(self, rank: int) -> str:
        """One line: which learner, where it ran, how it ended."""
        place = self.places.get(rank, {})
        where = f" (pid {place['pid']} on {place['ip']})" if place else ""
        try:
            ray.get(self.runs[rank])
            how = "ended before the run did"
        except ray.exceptions.RayActorError as error:
            how = f"died ({first_line(error)})"
        except ray.exceptions.RayTaskError as error:
            how = f"failed: {first_line(error.cause) if error.cause is not None else first_line(error)}"
        return f"learner {rank}{where} {how}; the run stopped with learner 0's checkpoint"

    def stop(self) -> None:
        if self.runs:  # they checkpoint before they end: give them the time
            ray.wait(list(self.runs.values()), num_returns=len(self.runs), timeout=EXIT_WAIT_S)
        for handle in self.handles.values():
            ray.kill(handle, no_restart=True)  # ended or stuck: either way its resources go back
