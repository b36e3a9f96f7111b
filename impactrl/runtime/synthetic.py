"""Synthetic actors: a load harness for the learner's intake, apart from envs and inference.

``impactrl bench --synthetic-actors N`` replaces the actors with N simulated ones, several per
process. Each process first records a few unrolls with one real :class:`~impactrl.runtime.actor.Actor`
(real envs, the learner's first weights), then replays them into the runtime's channels as fast
as those take them, each unroll tagged with the newest published version, so the learner's
receive, assembly, transfer and publication work as in training, and policy lag is measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from impactrl.config import TrainConfig
from impactrl.data.rollout import ACTOR_STAGES, RolloutSpec, SlotStore, UnrollRecord
from impactrl.runtime.actor import Actor, StartArgs, WeightSource


@dataclass(frozen=True)
class Synthetic:
    """An ``ActorProgram`` (runtime/actor.py): ``actors_per_process`` simulated actors per process."""

    actors_per_process: int
    recorded_unrolls: int = 4  # replayed in turn, so batches are not one unroll repeated

    def run(self, config: TrainConfig, spec: RolloutSpec, actor_ids: list[int], start: StartArgs,
            weights: WeightSource, sinks: list, should_stop: Callable[[], bool], wait: Callable[[float], None]) -> None:
        recorded, reward_stats = record_unrolls(config, spec, actor_ids[0], start.generation, weights,
                                                self.recorded_unrolls)
        replay(recorded, reward_stats, sinks, weights.version, should_stop, wait)


class ReplaySink(Protocol):
    actor_id: int

    def try_acquire(self) -> int | None:
        """A free slot now, or None."""

    def arrays(self, slot: int) -> dict[str, np.ndarray]: ...

    def commit(self, slot: int, record: UnrollRecord) -> None: ...

    def heartbeat(self) -> None: ...


def record_unrolls(config: TrainConfig, spec: RolloutSpec, actor_id: int, generation: int, weights: WeightSource,
                   count: int) -> tuple[SlotStore, list[np.ndarray | None]]:
    """``count`` unrolls of one real actor with the published weights, and its reward normalisers after each."""
    actor = Actor(config, actor_id, generation)
    weights.load_into(actor.agent)
    store = SlotStore(spec, count, shared=False)
    reward_stats = []
    try:
        for slot in range(count):
            actor.unroll(store.slot_arrays(slot))
            reward_stats.append(actor.envs.reward_stats())
    finally:
        actor.close()
    return store, reward_stats


def replay(recorded: SlotStore, reward_stats: list[np.ndarray | None], sinks: list[ReplaySink],
           version: Callable[[], int], should_stop: Callable[[], bool], wait: Callable[[float], None]) -> None:
    """Each sink's actor writes the recorded unrolls in turn into every slot it gets, until stopped;
    ``wait`` blocks until a slot may have come free (or the timeout passes)."""
    arrays = [recorded.slot_arrays(i) for i in range(recorded.num_slots)]
    turn = [actor_id % len(arrays) for actor_id in range(len(sinks))]
    idle = dict.fromkeys(ACTOR_STAGES, 0.0)
    while not should_stop():
        wrote = False
        for i, sink in enumerate(sinks):
            slot = sink.try_acquire()
            if slot is None:
                continue
            source = arrays[turn[i]]
            for key, target in sink.arrays(slot).items():
                np.copyto(target, source[key])
            sink.commit(slot, UnrollRecord(sink.actor_id, version(), idle, 0, reward_stats[turn[i]]))
            turn[i] = (turn[i] + 1) % len(arrays)
            wrote = True
        for sink in sinks:
            sink.heartbeat()
        if not wrote:
            wait(0.5)
