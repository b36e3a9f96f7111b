"""The learner loop with several learners (``--num-learners N``): the same steps, in lockstep.

Every learner makes the same collective calls in the same order (runtime/distributed.py), so each
step begins with one agreement, a ``Round``: whether to stop (learner 0 decides; any learner's
failure stops all), whether every learner has the data for the next SGD step, and whether to
checkpoint, so that they take the same steps and checkpoint the same state. A batch that came is
held until all can take theirs. A learner whose health check failed checkpoints with the others
before the run stops with its failure.
"""

from __future__ import annotations

import torch

from impactrl.data.rollout import Batch
from impactrl.runtime.distributed import Round
from impactrl.runtime.learner import LearnerLoop


class LockstepLearnerLoop(LearnerLoop):
    """``LearnerLoop`` for one of several learners."""

    held: tuple[Batch, dict[str, torch.Tensor]] | None = None  # came, not yet handed to the algorithm
    failure: BaseException | None = None  # this learner's, raised once all have checkpointed
    peer_failed = False  # some learner failed: the run stops

    def step(self) -> bool:
        agreed = self.agree()
        self.peer_failed = agreed.failed
        if agreed.stop or agreed.failed:
            return False
        self.learner.wall_time_progress = agreed.wall_time_progress
        if self.held is not None and (self.learner.algorithm.wants_data() or not agreed.not_holding):
            self.take(*self.held)
            self.held = None
        if agreed.not_ready:
            return True  # a batch (some learner's) did not come within the wait: check health and stop again
        self.train()
        if self.telemetry.due():
            self.write_metrics()
        if agreed.checkpoint:
            self.checkpointer.save()
        return True

    def agree(self) -> Round:
        """This round's decisions, the same on every learner; receives a batch first if the
        algorithm needs one and the run goes on."""
        leader = self.learner.group.rank == 0
        healthy = self.checked()
        self.learner.inbox.apply_to(self.learner.counters)
        stopping = leader and self.stop.reached()
        if healthy and not stopping and self.held is None:
            self.held = self.intake()
        return self.learner.group.agree(Round(
            stop=stopping, failed=not healthy, checkpoint=leader and self.checkpointer.due(),
            not_ready=self.waiting_for_data() and self.held is None, not_holding=self.held is None,
            wall_time_progress=self.stop.wall_time_progress() if leader else 0.0))

    def checked(self) -> bool:
        """The runtime's health check, kept (False) to be voted on, so that every learner
        checkpoints before the run stops."""
        try:
            self.check_health()
        except BaseException as error:
            self.failure = error
        return self.failure is None

    def ended(self) -> None:
        if self.peer_failed:
            raise self.failure or self.learner.group.failure(None)
