"""``--runtime ray`` against ``--runtime local``, side by side in one run, and Ray with many actors
on a two-node cluster on this machine.

Part "side": ``impactrl bench`` (IMPALA, 2 actors, each env's preset) with each runtime in turn,
the order alternating between rounds, so both see the same machine. Part "cluster": a
``ray.cluster_utils.Cluster`` of two nodes here, each promising ``--node-cpus`` logical CPUs, and
runs with 8 and 16 actors on 2 cores: oversubscribed, so what is measured is that lag and memory
stay bounded (memory is the PSS of every Ray process plus the learner, sampled every 2 s).
Part "delta": weight broadcasts as full copies and as lossless and lossy deltas: bytes per
broadcast on the CNN presets (MinAtar, Pong: ``--seconds`` of training each), and CartPole
learning curves to 500k steps with each (seed 1).

    python benchmarks/ray_vs_local.py --seconds 60 --rounds 2 >> benchmarks/results/ray_vs_local.jsonl
    python benchmarks/ray_vs_local.py --parts cluster delta --seconds 90
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from impactrl.bench import summarize
from impactrl.metrics import read_metrics
from impactrl.runtime.ray import two_node_cluster

ENVS = ("CartPole-v1", "MinAtar/Breakout-v1", "ALE/Pong-v5")
RAY_PROCESS_NAMES = (b"raylet", b"gcs_server", b"ray::", b"default_worker.py", b"log_monitor.py")


def bench(env: str, runtime: str, seconds: float, *flags: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "impactrl", "bench", "--algo", "impala", "--env", env,
                             "--num-actors", "2", "--runtime", runtime, "--seconds", str(seconds), *flags],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def side_by_side(seconds: float, rounds: int, envs: list[str]) -> None:
    for env in envs:
        for round_ in range(rounds):
            order = ("local", "ray") if round_ % 2 == 0 else ("ray", "local")
            for runtime in order:
                summary = bench(env, runtime, seconds)
                print(json.dumps({"part": "side", "env": env, "runtime": runtime, "round": round_,
                                  "seconds": seconds, **summary}), flush=True)


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def ray_and_learner_pids(learner: int) -> list[int]:
    pids = [learner]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if any(name in (entry / "cmdline").read_bytes() for name in RAY_PROCESS_NAMES):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def sample_memory(process: subprocess.Popen, samples: list[tuple[float, int]]) -> None:
    began = time.monotonic()
    while process.poll() is None:
        samples.append((time.monotonic() - began, sum(map(pss_kib, ray_and_learner_pids(process.pid)))))
        time.sleep(2.0)


def on_cluster(seconds: float, actor_counts: list[int], node_cpus: int, env: str) -> None:
    with two_node_cluster(node_cpus) as address:
        for actors in actor_counts:
            run_dir = Path(tempfile.mkdtemp(prefix="impactrl-ray-cluster-")) / "run"
            process = subprocess.Popen(
                [sys.executable, "-m", "impactrl", "train", "--algo", "impala", "--env", env, "--runtime", "ray",
                 "--ray-address", address, "--num-actors", str(actors), "--total-env-steps", str(10**12),
                 "--max-wall-time-s", str(seconds), "--log-interval-s", "2", "--checkpoint-interval-s", str(10**9),
                 "--out", str(run_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            samples: list[tuple[float, int]] = []
            sampler = threading.Thread(target=sample_memory, args=(process, samples))
            sampler.start()
            _, stderr = process.communicate()
            sampler.join()
            if process.returncode != 0:
                raise RuntimeError(stderr[-2000:])
            records = read_metrics(run_dir / "metrics.jsonl")
            info = json.loads((run_dir / "run_info.json").read_text())
            # An actor still starting (importing torch on an oversubscribed machine) has no entry yet.
            nodes = [incarnations[-1]["node_id"] for incarnations in info["actors"].values() if incarnations]
            summary = summarize(run_dir / "metrics.jsonl", warmup_s=seconds / 3)
            steady = [r for r in records if r["wall_time_s"] >= seconds / 3 and r["policy_lag_max"] is not None]
            third = len(samples) // 3
            print(json.dumps({
                "part": "cluster", "env": env, "runtime": "ray", "num_actors": actors, "nodes": 2,
                "node_cpus": node_cpus, "seconds": seconds, "actors_delivering": len(nodes), "actors_per_node": sorted(
                    np.unique(nodes, return_counts=True)[1].tolist()),
                "env_steps_per_s": summary["env_steps_per_s"], "policy_lag_mean": summary["policy_lag_mean"],
                "policy_lag_max": max(r["policy_lag_max"] for r in steady),
                "memory_mib_second_third": max(kib for _, kib in samples[third:2 * third]) / 1024,
                "memory_mib_last_third": max(kib for _, kib in samples[2 * third:]) / 1024,
                "actor_restarts": records[-1]["actor_restarts"]}), flush=True)


def train_ray(env: str, run_dir: Path, *flags: str) -> tuple[list[dict], dict]:
    subprocess.run([sys.executable, "-m", "impactrl", "train", "--algo", "impala", "--env", env, "--runtime", "ray",
                    "--num-actors", "2", "--log-interval-s", "2", "--out", str(run_dir), *flags],
                   capture_output=True, text=True, check=True)
    records = read_metrics(run_dir / "metrics.jsonl")
    return records, json.loads((run_dir / "run_info.json").read_text())


DELTAS = {"off": [], "lossless": ["--weight-delta", "lossless"],
          "lossy": ["--weight-delta", "lossy", "--weight-delta-bound", "1e-4"]}


def deltas(seconds: float) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="impactrl-ray-delta-"))
    for env in ("MinAtar/Breakout-v1", "ALE/Pong-v5"):
        for mode, flags in DELTAS.items():
            records, info = train_ray(env, scratch / f"{env.replace('/', '_')}-{mode}", "--total-env-steps",
                                      str(10**12), "--max-wall-time-s", str(seconds), *flags)
            print(json.dumps({"part": "delta", "env": env, "mode": mode, "seconds": seconds, **info["weights"],
                              "env_steps_per_s": records[-1]["env_steps"] / records[-1]["wall_time_s"]}), flush=True)
    for mode, flags in DELTAS.items():
        records, info = train_ray("CartPole-v1", scratch / f"cartpole-{mode}", "--total-env-steps", "500000",
                                  "--seed", "1", "--log-interval-s", "1", *flags)
        print(json.dumps({"part": "delta-curve", "env": "CartPole-v1", "mode": mode, **info["weights"],
                          "curve": [(r["env_steps"], r["episode_return_mean"]) for r in records],
                          "first_450_env_steps": next((r["env_steps"] for r in records
                                                       if (r["episode_return_mean"] or 0) >= 450), None)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["side", "cluster", "delta"], choices=["side", "cluster", "delta"])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--envs", nargs="+", default=list(ENVS))
    parser.add_argument("--actors", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--node-cpus", type=int, default=8)
    parser.add_argument("--cluster-env", default="CartPole-v1")
    args = parser.parse_args()
    if "side" in args.parts:
        side_by_side(args.seconds, args.rounds, args.envs)
    if "cluster" in args.parts:
        on_cluster(args.seconds, args.actors, args.node_cpus, args.cluster_env)
    if "delta" in args.parts:
        deltas(args.seconds)


if __name__ == "__main__":
    main()
