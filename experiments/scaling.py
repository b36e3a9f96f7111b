"""Claim (3): more actors help, with diminishing returns.

    python experiments/scaling.py --out runs/scaling [--env MinAtar/Breakout-v1] [--actors 1,2,4,8]
        [--algo impala] [--seeds 1,2,3] [--steps 1000000] [--ray-actors 2,4,8 --ray-node-cpus 4]

One run per actor count and seed, everything else fixed (the envs per actor too, so more actors
means more envs). With ``--ray-actors``, also runs on the Ray runtime on a two-node cluster
simulated on this machine (``ray.cluster_utils.Cluster``, each node promising
``--ray-node-cpus`` CPUs; the actors spread over both). The table gives per variant the
throughput (env steps/s over the run) beside the final return (equal env steps), the return at
equal wall time (over the last 10% of the shortest run's wall time) and the wall time to a
common return; with two cores, throughput stops growing once the actors and the learner fill
them. Writes ``ENV-steps.png``, ``ENV-time.png`` and ``table.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import LAST_FRACTION, TABLE_HEADER, compare, mean_std, write_table

from impactrl.envs.tasks import task_labels
from impactrl.plotting import curve, read_records
from impactrl.runtime.ray import two_node_cluster


def return_at(records: list[dict], wall_time_s: float) -> float | None:
    """Mean logged return over the last ``LAST_FRACTION`` of the first ``wall_time_s`` seconds."""
    xs, ys = curve(records, "wall_time_s", "episode_return_mean")
    window = [y for x, y in zip(xs, ys) if (1 - LAST_FRACTION) * wall_time_s <= x <= wall_time_s]
    return float(np.mean(window)) if window else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/scaling"))
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--actors", default="1,2,4,8")
    parser.add_argument("--algo", default="impala")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--ray-actors", default="", help="actor counts on a simulated two-node Ray cluster (e.g. 2,4,8)")
    parser.add_argument("--ray-node-cpus", type=int, default=4, help="CPUs each simulated node promises (default 4)")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    variants = {f"{count}-actors": ["--algo", args.algo, "--num-actors", count] for count in args.actors.split(",")}
    title = f"{args.algo} on {args.env}, seeds {args.seeds}"
    lines = TABLE_HEADER + compare(args.out, args.env, variants, seeds, args.steps, title)
    if args.ray_actors:  # the cluster only now, so that its servers do not share the cores with the local runs
        with two_node_cluster(args.ray_node_cpus) as address:
            for count in args.ray_actors.split(","):
                variants[f"ray-2-nodes-{count}-actors"] = ["--algo", args.algo, "--num-actors", count, "--runtime",
                                                           "ray", "--ray-address", address]
            lines = TABLE_HEADER + compare(args.out, args.env, variants, seeds, args.steps, title)
    label = task_labels([args.env])[0]
    records = {(name, seed): read_records(args.out / f"{label}-{name}-s{seed}") for name in variants for seed in seeds}
    shortest = min(runs[-1]["wall_time_s"] for runs in records.values())
    lines += ["", f"| variant | env steps/s (mean over the run) | return at {shortest:.0f} s |", "|---|---|---|"]
    for name in variants:
        ends = [records[name, seed][-1] for seed in seeds]
        at_time = [return_at(records[name, seed], shortest) for seed in seeds]
        lines.append(f"| {name} | {np.mean([end['env_steps'] / end['wall_time_s'] for end in ends]):,.0f} | "
                     f"{mean_std(at_time)} |")
    write_table(args.out, lines)


if __name__ == "__main__":
    main()
