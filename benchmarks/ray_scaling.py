"""The learner-side costs that grow with actors under ``--runtime ray``, measured on this machine
for docs/ray.md's "Scaling on paper".

1. Assembly: the learner copies every unroll it receives once, into its columns of the batch
   being filled; the time for a batch of 32 unrolls, per env preset.
2. Calls: with 64 (or more) Ray actors that answer at once, how many calls per second the
   learner process submits and gets back (what bounds takes per second).

    python benchmarks/ray_scaling.py >> benchmarks/results/ray_scaling.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time

import numpy as np
import torch

from impactrl.config import TrainConfig, preset_values
from impactrl.data.rollout import BatchAssembler, SlotStore, data_bytes
from impactrl.envs import env_family
from impactrl.training import build_learner


def assemble_cost(env: str, batch_unrolls: int, repeats: int) -> dict:
    values = preset_values("impala", env_family(env))
    config = dataclasses.replace(TrainConfig(env=env), **{k: tuple(v) if isinstance(v, list) else v
                                                          for k, v in values.items()})
    _, spec = build_learner(config, None)
    incoming, record, created_at = SlotStore(spec, 1, shared=False).unroll(0)
    assembler = BatchAssembler(spec, batch_unrolls)
    began = time.perf_counter()
    for _ in range(repeats):
        for _ in range(batch_unrolls):
            assembler.add(incoming, record, created_at)
        assembler.take()
    unroll_bytes = data_bytes(spec)
    return {"part": "assemble", "env": env, "batch_unrolls": batch_unrolls, "unroll_bytes": unroll_bytes,
            "frame_dedup": spec.frame_stack > 1, "assemble_ms_per_batch": 1000 * (time.perf_counter() - began) / repeats}


def call_rate(actors: int, seconds: float, payload_bytes: int) -> dict:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    try:
        @ray.remote(num_cpus=0)
        class Echo:
            def take(self, payload):
                return 0

        handles = [Echo.remote() for _ in range(actors)]
        ray.get([handle.take.remote(None) for handle in handles])
        payload = np.zeros(payload_bytes, np.uint8)
        calls = 0
        out = []
        began = time.perf_counter()
        while time.perf_counter() - began < seconds:
            out += [handle.take.remote(payload) for handle in handles]
            done, out = ray.wait(out, num_returns=len(out), timeout=0)
            calls += len(done)
        ray.get(out)
        calls += len(out)
        return {"part": "calls", "actors": actors, "payload_bytes": payload_bytes,
                "calls_per_s": calls / (time.perf_counter() - began)}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for env in ("CartPole-v1", "MinAtar/Breakout-v1", "ALE/Pong-v5"):
        print(json.dumps(assemble_cost(env, 32, 20)), flush=True)
    for payload in (0, 18_700):  # an empty call; the CartPole weights inline
        print(json.dumps(call_rate(args.actors, args.seconds, payload)), flush=True)


if __name__ == "__main__":
    main()
