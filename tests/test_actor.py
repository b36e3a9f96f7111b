"""The actor loop (run_actor) against in-process endpoints: what it commits, with which weights."""

import pytest

from impactrl.config import TrainConfig
from impactrl.data.rollout import SlotStore
from impactrl.runtime.actor import run_actor
from impactrl.training import build_learner

PPO = TrainConfig(algo="ppo", env="CartPole-v1", num_actors=2, envs_per_actor=2, unroll_length=4,
                  num_minibatches=1, update_epochs=1)


class Learner:
    """The WeightSource and RolloutSink of one actor in a synchronous run: a new publication
    once the actor has waited a few heartbeats after its last commit, as if the other actors'
    unrolls had come and the learner had trained on the batch."""

    def __init__(self, publication: int, commits_wanted: int):
        self.publication_now = publication
        self.commits_wanted = commits_wanted
        self.committed: list[int] = []  # the publication each commit was acted with
        self.loaded = publication
        self.waited = 0
        self.store = SlotStore(build_learner(PPO, None)[1], num_slots=1, shared=False)

    def publication(self) -> int:
        return self.publication_now

    def load_into(self, agent) -> tuple[int, int]:
        self.loaded = self.publication_now
        return 10 * self.loaded, self.loaded  # the version: the learner's updates at that publication

    def acquire(self) -> int:
        return 0

    def arrays(self, slot: int):
        return self.store.slot_arrays(slot)

    def commit(self, slot: int, record) -> None:
        assert record.policy_version == 10 * self.loaded
        self.committed.append(self.loaded)
        self.waited = 0

    def heartbeat(self) -> None:
        self.waited += 1
        if self.waited == 5:
            self.publication_now += 1

    def done(self) -> bool:
        return len(self.committed) >= self.commits_wanted


@pytest.mark.parametrize("committed_with, expected", [(None, [3, 4, 5]), (2, [3, 4, 5]), (3, [4, 5, 6])])
def test_a_restarted_synchronous_actor_acts_once_per_publication(committed_with, expected):
    """PPO takes one unroll per actor and publication: an actor restarted after its unroll of
    publication 3 reached the learner acts next with publication 4, not 3 again; one whose last
    unroll the learner has is of an older publication (or none) acts with 3 at once."""
    learner = Learner(publication=3, commits_wanted=3)
    run_actor(PPO, 0, learner, learner, learner.done, generation=1, committed_with=committed_with)
    assert learner.committed == expected
