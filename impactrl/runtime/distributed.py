"""Several learners as one: data-parallel SGD over torch.distributed.

With ``--num-learners N`` each learner process trains on 1/N of every batch, fed by its own actors
(actor i feeds learner i % N). The learners stay in lockstep: every one of them makes the same
collective calls in the same order, and the state that must agree does so by construction or by
reduction:

- gradients: one all-reduce of one flat buffer between ``loss.backward()`` and the gradient-norm
  clip, summed or averaged as the algorithm's loss reduces over its batch (``Algorithm.loss_reduction``:
  IMPALA sums, IMPACT and PPO average), with the loss and IMPACT's KL packed in, so the
  skip-if-non-finite decision and the adaptive KL coefficient are the same everywhere;
- PopArt's statistics and the observation normaliser: their moments are summed over the learners
  (``sum``); PPO's and IMPACT's advantage normalisation use the mean and std of all shards
  (``mean_std``); PPO's minibatch permutations and IMPACT's buffer draws come from generators
  seeded alike; IMPACT's target refreshes go by the update count;
- the loop's decisions (stop, checkpoint, whether every learner has the data for the next step):
  one small all-reduce per loop round (``agree`` of a ``Round``; runtime/lockstep.py), with
  learner 0's deciding when to stop;
- initial weights and optimiser state: every learner starts from learner 0's state.

``LearnerGroup`` is the no-op form (one learner: every reduction is the identity), so the
learner's SGD step is the same for one learner and for N; only the loop differs (one learner runs
``LearnerLoop`` with no agreement at all). A collective that fails (a peer died, or was silent
for ``PEER_TIMEOUT_S``) raises what the runtime's ``PeerWatch`` makes of it: on learner 0, one
line naming the learner, its pid and how it ended.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

# How long a learner waits in a collective for the others. Between two collectives a learner waits
# at most about a second for its actors' data (then votes "not ready"), restarts actors and writes
# a checkpoint, so only a hung (stopped, swapping) peer takes this long; a killed one breaks its
# connections and is noticed at once.
PEER_TIMEOUT_S = 300.0

@dataclass(frozen=True)
class Round:
    """One lockstep round's decisions, agreed by ``agree`` as the maximum over the learners:
    learner 0's ``stop``, ``checkpoint`` and ``wall_time_progress`` decide (the others give 0);
    ``failed`` (a learner's health check raised), ``not_ready`` (a learner that needs a batch has
    none) and ``not_holding`` (a learner holds no batch) are any learner's."""

    stop: bool
    failed: bool
    checkpoint: bool
    not_ready: bool
    not_holding: bool
    wall_time_progress: float


class PeerWatch(Protocol):
    """What the runtime of learner 0 knows about the other learner processes."""

    def check(self) -> None:
        """Before each round: relay the others' messages; raise LearnerFailed if one is gone."""

    def failure(self, error: BaseException | None) -> BaseException:
        """What to raise once a collective failed with ``error``, or (None) a peer voted a failure."""


class PeerStopped(Exception):
    """In a learner other than 0: the run stopped because of another learner; it exits quietly."""


class LearnerGroup:
    """One learner alone: every reduction is the identity."""

    rank = 0
    size = 1

    def reduce_gradients(self, parameters: list[torch.Tensor], scalars: torch.Tensor, average: bool) -> torch.Tensor:
        """Sum (or, ``average``, average) the parameters' gradients over the learners, in place;
        returns ``scalars`` (the loss, IMPACT's KL) averaged over the learners."""
        return scalars

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the learners, in place (moments of PopArt's targets, observations)."""
        return tensor

    def mean_std(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean and unbiased standard deviation of ``values`` over every learner's shard (equal sizes)."""
        return values.mean(), values.std()

    def agree(self, proposal: Round) -> Round:
        """Every learner's ``proposal``, reduced field by field to the maximum."""
        return proposal

    def failure(self, error: BaseException | None) -> BaseException:
        """What to raise when the run stops for a failure elsewhere (never, alone)."""
        return error or PeerStopped()

    def close(self) -> None:
        pass


class DistributedGroup(LearnerGroup):
    """Learner ``rank`` of ``size`` over torch.distributed, joined through the TCP store of learner 0
    at ``host``:``port`` (learner 0 hosts it: ``port`` 0 picks a free one, then ``self.port``)."""

    def __init__(self, rank: int, size: int, port: int, device: torch.device, watch: PeerWatch | None = None,
                 host: str = "127.0.0.1"):
        self.rank, self.size, self.device, self.watch = rank, size, device, watch
        timeout = datetime.timedelta(seconds=PEER_TIMEOUT_S)
        self.store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout,
                                   wait_for_workers=False)  # learner 0 starts the others once it has a port
        self.port = self.store.port
        self.joined = False

    def join(self) -> None:
        """Wait for every learner (learner 0 first starts the others, then joins). Learner 0 first
        waits for the others to arrive at the store, watching them: one that dies while starting
        ends the run at once, not after PEER_TIMEOUT_S."""
        if self.rank == 0:
            self._await_peers()
        else:
            self.store.set(f"arrived/{self.rank}", "1")
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=self.store, rank=self.rank, world_size=self.size,
                                timeout=datetime.timedelta(seconds=PEER_TIMEOUT_S))
        self.joined = True

    def _await_peers(self) -> None:
        arrivals = [f"arrived/{rank}" for rank in range(1, self.size)]
        deadline = time.monotonic() + PEER_TIMEOUT_S
        while not self.store.check(arrivals):
            if self.watch is not None:
                self.watch.check()
            if time.monotonic() > deadline:
                raise self.failure(TimeoutError(f"not every learner arrived within {PEER_TIMEOUT_S:g} s"))
            time.sleep(0.05)

    def _all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        try:
            dist.all_reduce(tensor, op=op)
        except RuntimeError as error:  # DistBackendError and gloo's own: a peer died or timed out
            raise self.failure(error) from error
        return tensor

    def reduce_gradients(self, parameters: list[torch.Tensor], scalars: torch.Tensor, average: bool) -> torch.Tensor:
        grads = [p.grad for p in parameters if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads] + [scalars.to(grads[0].dtype).reshape(-1)])
        self._all_reduce(flat)
        offset = 0
        for grad in grads:
            reduced = flat[offset:offset + grad.numel()].view_as(grad)
            grad.copy_(reduced / self.size if average else reduced)
            offset += grad.numel()
        return flat[offset:] / self.size

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor)

    def mean_std(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Two passes, as x.mean() and x.std() are: the mean first, then the squares about it (no
        # cancellation between a sum of squares and a squared sum).
        count = values.numel() * self.size
        mean = self._all_reduce(values.sum().reshape(1).double())[0] / count
        square = self._all_reduce((values.double() - mean).square().sum().reshape(1))[0]
        return mean.to(values.dtype), (square / max(count - 1, 1)).sqrt().to(values.dtype)

    def agree(self, proposal: Round) -> Round:
        if self.watch is not None:
            self.watch.check()
        names = [field.name for field in dataclasses.fields(Round)]
        tensor = torch.tensor([float(getattr(proposal, name)) for name in names], dtype=torch.float64, device=self.device)
        self._all_reduce(tensor, dist.ReduceOp.MAX)
        return Round(**{name: type(getattr(proposal, name))(value) for name, value in zip(names, tensor.tolist())})

    def failure(self, error: BaseException | None) -> BaseException:
        return self.watch.failure(error) if self.watch is not None else PeerStopped()

    def close(self) -> None:
        if self.joined:
            dist.destroy_process_group()
            self.joined = False


def learner_actor_ids(num_actors: int, num_learners: int, rank: int) -> list[int]:
    """The actors that feed learner ``rank``: actor i feeds learner i % num_learners."""
    return list(range(rank, num_actors, num_learners))

