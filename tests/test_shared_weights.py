"""SharedWeights, the local runtime's learner -> actors channel, under a publisher and readers in
other processes: every read is one publication, whatever the CPU's memory order, and no process
killed anywhere blocks the others."""

import os
import signal
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

from impactrl.runtime.local import SharedWeights, Stopping, WeightsUnreadable


def make_agent() -> torch.nn.Module:
    """Several tensors of several sizes: a torn read mixes publications across or within them."""
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64), torch.nn.Linear(64, 3))


def fill(agent: torch.nn.Module, version: int) -> None:
    with torch.no_grad():
        for parameter in agent.parameters():
            parameter.fill_(float(version))


def publish_forever(weights: SharedWeights, started, stop=None) -> None:
    """Publish back to back, with no pause: as fast as a learner ever could; until ``stop`` (a
    shared value) is set, or forever without one."""
    torch.set_num_threads(1)
    agent = make_agent()
    version = 1
    while stop is None or not stop.value:
        fill(agent, version)
        weights.publish(agent, version)
        started.value = version
        version += 1


def hold_the_lock(weights: SharedWeights, holding) -> None:
    """An actor killed inside one of its few-microsecond sections, made to last."""
    assert weights._lock.acquire(timeout=60)
    holding.value = 1
    time.sleep(3600)


def hold_the_lock_until_told(weights: SharedWeights, holding) -> None:
    """An actor stopped inside a section (preempted, SIGSTOPped): it must find its lock still its own."""
    assert weights._lock.acquire(timeout=60)
    holding.value = 1
    while holding.value == 1:
        time.sleep(0.01)
    weights._lock.release()  # raises if another process had released it
    holding.value = 3


def values_of(agent: torch.nn.Module) -> list[float]:
    """The distinct values across the agent's tensors (one, when they are one publication's)."""
    return sorted({bound for value in agent.state_dict().values() for bound in map(float, value.aminmax())})


def weights_and_process(target, *flag_types: str):
    """Fresh SharedWeights of a small agent and a spawned process running ``target(weights, *flags)``,
    one shared value (initially 0) of each of ``flag_types``: (agent, weights, flags, process)."""
    ctx = mp.get_context("spawn")
    agent = make_agent()
    weights = SharedWeights(agent, ctx)
    flags = [ctx.Value(kind, 0, lock=False) for kind in flag_types]
    process = ctx.Process(target=target, args=(weights, *flags), daemon=True)
    process.start()
    return agent, weights, flags, process


def test_every_read_is_one_publication_while_another_process_publishes_back_to_back():
    agent, weights, (started, stop), publisher = weights_and_process(publish_forever, "q", "b")
    try:
        reader = make_agent()
        version, publication = weights.load_into(reader)  # waits for the first publish
        reads, last = 0, publication
        deadline = time.monotonic() + 30
        while (reads < 300 or started.value < 100) and time.monotonic() < deadline:
            version, publication = weights.load_into(reader)
            assert values_of(reader) == [float(version)], f"read {reads} mixed publications"
            assert publication >= last  # never an older one than already read
            last, reads = publication, reads + 1
        assert reads >= 300 and started.value >= 100 and last > 1
    finally:
        stop.value = 1  # it ends by itself after its current publication
        publisher.join(20)
        if publisher.is_alive():  # only when the test already failed: it must not outlive it
            publisher.kill()
    assert publisher.exitcode == 0


@pytest.mark.slow  # kills a process
def test_a_publisher_killed_anywhere_leaves_whole_weights_or_readers_that_stop():
    agent, weights, (started,), publisher = weights_and_process(publish_forever, "q")
    reader = make_agent()
    deadline = time.monotonic() + 60
    while started.value < 100 and time.monotonic() < deadline:  # publishing back to back
        time.sleep(0.01)
    assert started.value >= 100, "the publisher never published"
    publisher.kill()
    publisher.join(10)
    if weights._lock.acquire(timeout=0):
        # The publisher died outside the lock (mid-copy, most likely): a whole one is still read.
        weights._lock.release()
        version, _ = weights.load_into(reader)
        assert values_of(reader) == [float(version)]
    else:
        # It died inside one of its sections: the reader waits until told the learner is gone.
        weights.attach(lambda: None, lambda: True)
        with pytest.raises(Stopping):
            weights.load_into(reader)


class OvertakenAgent(torch.nn.Module):
    """An agent whose every copy is overtaken by two publications (a reader that always loses)."""

    def __init__(self, weights: SharedWeights, source: torch.nn.Module):
        super().__init__()
        self.weights, self.source = weights, source

    def load_state_dict(self, state, strict=True):
        for _ in range(2):
            self.weights.publish(self.source, 0)


def test_a_reader_that_keeps_losing_sends_heartbeats_and_gives_up_with_a_clear_error():
    agent = make_agent()
    weights = SharedWeights(agent, mp.get_context("spawn"))
    weights.publish(agent, 0)
    beats = []
    weights.attach(lambda: beats.append(time.monotonic()), lambda: False)
    weights.give_up_s = 0.5
    began = time.monotonic()
    with pytest.raises(WeightsUnreadable, match="--publish-interval"):
        weights.load_into(OvertakenAgent(weights, agent))
    assert 0.5 <= time.monotonic() - began < 10 and len(beats) > 10


@pytest.mark.slow  # kills a process
def test_a_reader_killed_inside_the_lock_blocks_the_learner_only_briefly():
    agent, weights, (holding,), holder = weights_and_process(hold_the_lock, "b")
    deadline = time.monotonic() + 60
    while not holding.value and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    fill(agent, 3)
    began = time.monotonic()
    weights.publish(agent, 3)
    assert time.monotonic() - began < 1.0
    reader = make_agent()
    assert weights.load_into(reader)[0] == 3 and values_of(reader) == [3.0]


def test_a_live_holder_keeps_the_lock_however_long_it_holds_it():
    agent, weights, (holding,), holder = weights_and_process(hold_the_lock_until_told, "b")
    try:
        deadline = time.monotonic() + 30
        while not holding.value and time.monotonic() < deadline:
            time.sleep(0.01)
        refusals = []  # the learner's waits for the lock beat once per refused 50 ms try
        weights.attach(lambda: refusals.append(1), lambda: False)
        published = threading.Event()
        publisher = threading.Thread(target=lambda: (weights.publish(agent, 1), published.set()), daemon=True)
        publisher.start()
        while len(refusals) < 20 and time.monotonic() < deadline:  # polled: a second of tries, at least
            time.sleep(0.01)
        assert len(refusals) >= 20 and not published.is_set()  # it waits for the holder: it releases nothing of another's
        holding.value = 2
        assert published.wait(10)
        holder.join(10)
        assert holder.exitcode == 0 and holding.value == 3
    finally:
        if holder.is_alive():
            holder.kill()
