"""The learner's intake alone: ``impactrl bench --synthetic-actors N --no-learning`` on Pong unrolls,
with 8, 64 and 256 simulated actors, on the local runtime and on a two-node Ray cluster simulated
on this machine (``ray.cluster_utils.Cluster``, 2 GiB of object store per node). One JSON line
per run, with the learner's time per publication (publish share / updates per second: IMPALA
publishes after every update).

    python benchmarks/intake.py >> benchmarks/results/intake.jsonl
    python benchmarks/intake.py --runtimes ray --actors 256 --seconds 300   # the soak
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from impactrl.runtime.ray import two_node_cluster

PONG = ["--env", "ALE/Pong-v5", "--algo", "impala", "--env-backend", "envpool", "--no-learning", "--json"]


def bench(actors: int, seconds: float, *flags: str) -> dict:
    per_process = max(1, actors // 2)  # two processes of simulated actors: one per node on Ray
    result = subprocess.run([sys.executable, "-m", "impactrl", "bench", *PONG, "--synthetic-actors", str(actors),
                             "--actors-per-process", str(per_process), "--seconds", str(seconds),
                             "--warmup-seconds", str(min(20.0, seconds / 3)), *flags],
                            capture_output=True, text=True, check=True)
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    updates = summary["updates_per_s"]
    summary["publish_ms_per_publication"] = 1000 * summary["learner_publish_fraction"] / updates if updates else None
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtimes", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    parser.add_argument("--actors", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    for runtime in args.runtimes:
        for actors in args.actors:
            if runtime == "local":
                print(json.dumps(bench(actors, args.seconds)), flush=True)
                continue
            with two_node_cluster(node_cpus=max(actors, 8)) as address:
                print(json.dumps(bench(actors, args.seconds, "--runtime", "ray", "--ray-address", address,
                                       "--ray-actor-cpus", "1")), flush=True)


if __name__ == "__main__":
    main()
