"""The raw environment ceiling: random actions, no learning, with impactrl's own preprocessing.

    python benchmarks/env_ceiling.py --envs CartPole-v1 MinAtar/Breakout-v1 ALE/Pong-v5 --seconds 10

For each env: steps/s of one process, and the summed steps/s of one process per core stepping
at the same time (what the machine can give the actors at most).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time

from impactrl.envs import EnvOptions, make_env


def step_for(env_id: str, seconds: float, seed: int) -> float:
    env = make_env(env_id, EnvOptions(), seed=seed, training=True)
    env.reset(seed=seed)
    steps, deadline = 0, time.perf_counter() + seconds
    began = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(100):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 100
    rate = steps / (time.perf_counter() - began)
    env.close()
    return rate


def ceiling(env_id: str, seconds: float, processes: int) -> dict:
    one = step_for(env_id, seconds, seed=0)
    with mp.get_context("spawn").Pool(processes) as pool:
        rates = pool.starmap(step_for, [(env_id, seconds, seed) for seed in range(processes)])
    return {"env": env_id, "one_process_steps_per_s": one, "processes": processes,
            "all_processes_steps_per_s": sum(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "MinAtar/Breakout-v1", "ALE/Pong-v5"])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    args = parser.parse_args()
    for env_id in args.envs:
        print(json.dumps(ceiling(env_id, args.seconds, args.processes)), flush=True)


if __name__ == "__main__":
    main()
