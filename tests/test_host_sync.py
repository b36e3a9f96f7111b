"""The learner's SGD step reads nothing back from its device, so that a GPU learner queues step
k+1 while step k runs. On the CPU the same code runs with every host read of a tensor counted;
where CUDA exists, ``torch.cuda.set_sync_debug_mode("error")`` checks the real thing."""

import collections
import contextlib
import dataclasses

import pytest
import torch

from conftest import collect

from impactrl.config import TrainConfig
from impactrl.metrics import IntervalStats

HOST_READS = ("item", "tolist", "numpy", "nonzero", "__float__", "__int__", "__bool__", "__index__")

SMALL = TrainConfig(env="CartPole-v1", envs_per_actor=4, unrolls_per_batch=4, unroll_length=10, learning_rate=1e-3)
CONFIGS = {
    "impala-rmsprop-popart-obsnorm": dataclasses.replace(SMALL, algo="impala", optimizer="rmsprop", rmsprop_momentum=0.9,
                                                          popart=True, normalize_observations=True),
    "impala-rmsprop_tf": dataclasses.replace(SMALL, algo="impala", optimizer="rmsprop_tf", rmsprop_momentum=0.9),
    "impact-adam-kl-popart": dataclasses.replace(SMALL, algo="impact", optimizer="adam", use_kl_loss=True, popart=True,
                                                 buffer_batches=1, buffer_uses=3, target_update_period=2,
                                                 normalize_advantages=True),
    "ppo-adam-obsnorm": dataclasses.replace(SMALL, algo="ppo", optimizer="adam", num_minibatches=2, update_epochs=2,
                                            normalize_observations=True),
}


@contextlib.contextmanager
def counted_host_reads(calls: collections.Counter):
    """Counts into ``calls`` the calls that read a tensor's value on the host (each a device sync on a GPU)."""
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def counting(name, original):
        def read(self, *args, **kwargs):
            calls[name] += 1
            return original(self, *args, **kwargs)
        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, counting(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def sgd_steps(config: TrainConfig, guard) -> tuple[int, list[dict]]:
    """Every SGD step the learner takes on three batches, each inside ``guard()``."""
    learner, batches = collect(config, slots=3)
    steps, all_stats = 0, []
    for batch in batches:
        learner.add(batch)
        while True:
            with guard():
                stats = learner.update()
            if stats is None:
                break
            steps += 1
            all_stats.append(stats)
    return steps, all_stats


@pytest.mark.parametrize("name", CONFIGS)
def test_an_sgd_step_reads_nothing_back_from_the_device(name):
    calls: collections.Counter = collections.Counter()
    with counted_host_reads(calls):  # the counter counts
        assert float(torch.ones(())) == 1.0 and calls == {"__float__": 1}
    calls.clear()
    steps, _ = sgd_steps(CONFIGS[name], lambda: counted_host_reads(calls))
    assert steps >= 3
    assert dict(calls) == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", CONFIGS)
def test_an_sgd_step_on_cuda_does_not_synchronise(name):
    @contextlib.contextmanager
    def no_sync():
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")

    steps, _ = sgd_steps(dataclasses.replace(CONFIGS[name], device="cuda"), no_sync)
    assert steps >= 3


def test_statistics_kept_on_the_device_average_as_their_python_floats_did():
    """metrics.jsonl's values are unchanged: a float64 sum on the device of each step's statistic
    is the sum of its Python floats, and a skipped step's (NaN) statistics stay out of both."""
    _, all_stats = sgd_steps(CONFIGS["impact-adam-kl-popart"], contextlib.nullcontext)
    on_device, as_floats = IntervalStats(40), IntervalStats(40)
    for stats in all_stats:
        on_device.add(stats)
        as_floats.add({key: float(value) for key, value in stats.items()})
    skipped = {key: torch.tensor(float("nan")) for key in all_stats[0]}
    on_device.add(skipped, taken=torch.tensor(False))
    assert on_device.summary() == as_floats.summary()
