"""The raw environment ceiling: random actions, no learning, with impactrl's own preprocessing.

    python benchmarks/env_ceiling.py --envs CartPole-v1 MinAtar/Breakout-v1 ALE/Pong-v5 --seconds 10 [--backend envpool]

For each env: steps/s of one process stepping an actor's vector of envs (8, as the presets give
CartPole and Pong), and the summed steps/s of one such process per core stepping at the same
time (what the machine can give the actors at most). Envs the backend lacks are skipped.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np

from impactrl.envs import EnvOptions, make_env_vector
from impactrl.envs.vector import envpool_task
from impactrl.errors import UserError


def step_for(env_id: str, seconds: float, seed: int, backend: str, num_envs: int) -> float:
    envs = make_env_vector(env_id, EnvOptions(), num_envs, seed=seed, backend=backend)
    envs.reset()
    envs.action_space.seed(seed)
    actions = np.array([[envs.action_space.sample() for _ in range(num_envs)] for _ in range(100)])
    steps, deadline = 0, time.perf_counter() + seconds
    began = time.perf_counter()
    while time.perf_counter() < deadline:
        for action in actions:
            envs.step(action)
        steps += len(actions) * num_envs
    rate = steps / (time.perf_counter() - began)
    envs.close()
    return rate


def ceiling(env_id: str, seconds: float, processes: int, backend: str, num_envs: int) -> dict:
    one = step_for(env_id, seconds, 0, backend, num_envs)
    with mp.get_context("spawn").Pool(processes) as pool:
        rates = pool.starmap(step_for, [(env_id, seconds, seed * num_envs, backend, num_envs) for seed in range(processes)])
    return {"env": env_id, "backend": backend, "envs_per_process": num_envs, "one_process_steps_per_s": one,
            "processes": processes, "all_processes_steps_per_s": sum(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["CartPole-v1", "MinAtar/Breakout-v1", "ALE/Pong-v5"])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--backend", choices=["gymnasium", "envpool"], default="gymnasium")
    parser.add_argument("--envs-per-process", type=int, default=8)
    args = parser.parse_args()
    for env_id in args.envs:
        try:
            envpool_task(env_id, EnvOptions()) if args.backend == "envpool" else None
        except UserError as error:
            print(f"skipped {env_id}: {error}", file=sys.stderr)
            continue
        print(json.dumps(ceiling(env_id, args.seconds, args.processes, args.backend, args.envs_per_process)), flush=True)


if __name__ == "__main__":
    main()
