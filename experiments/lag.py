"""Claim (6): policy lag makes the value error worse (the IMPALA document: above 5 versions, about
3x worse on Pong).

    python experiments/lag.py --out runs/lag [--env MinAtar/Breakout-v1] [--rollout-slots 3,6,12,24,48]
        [--seeds 1,2,3] [--steps 1000000]

The lag is controlled by the depth of the rollout queue: with the learner the slower side (as on
MinAtar and Pong here), actors keep every slot full, so an unroll waits behind the others and the
learner trains on it that many versions later. One IMPALA run per depth and seed, everything else
fixed. Writes ``lag.png`` and ``table.md``: against the measured policy lag, the value loss and
explained variance against V-trace targets over the second half of each run (after the early
learning), and the final agent's value error against the discounted returns that followed in
``--episodes`` evaluation episodes (``impactrl eval``: V-trace targets lean on the learner's own
value function, the returns that followed do not).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import evaluate, train, write_table

from impactrl.plotting import curve, read_records

METRICS = ("policy_lag_mean", "loss/baseline", "value/explained_variance", "episode_return_mean")
EVALUATED = ("value_mse", "value_explained_variance")


def second_half_means(records: list[dict], steps: int) -> dict[str, float]:
    out = {}
    for key in METRICS:
        xs, ys = curve(records, "env_steps", key)
        out[key] = float(np.mean([y for x, y in zip(xs, ys) if x >= steps / 2]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/lag"))
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--rollout-slots", "--queue-slots", dest="rollout_slots", default="3,6,12,24,48",
                        help="the depths: rollout slots of each run (--queue-slots: their old name)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes per run (default 100)")
    args = parser.parse_args()
    depths = [int(depth) for depth in args.rollout_slots.split(",")]
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for depth in depths:
        for seed in seeds:
            run_dir = args.out / f"slots{depth}-s{seed}"
            train(run_dir, args.steps, ["--algo", "impala", "--env", args.env, "--seed", str(seed), "--num-actors", "2",
                                        "--rollout-slots", str(depth)])
            values = second_half_means(read_records(run_dir), args.steps)
            evaluation = evaluate(run_dir, args.episodes)
            values.update({key: evaluation[key] for key in EVALUATED})
            rows.append((depth, seed, values))
    lines = ["| queue slots | seed | policy lag | value loss (V-trace targets) | explained variance (V-trace targets) "
             "| training return | value MSE (returns that followed) | explained variance (returns that followed) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {depth} | {seed} | " + " | ".join(f"{values[key]:.3f}" for key in (*METRICS, *EVALUATED)) + " |"
              for depth, seed, values in rows]
    low = [values for _, _, values in rows if values["policy_lag_mean"] <= 5]
    high = [values for _, _, values in rows if values["policy_lag_mean"] > 5]
    if low and high:
        lines.append("")
        for key in ("loss/baseline", "value_mse"):
            ratio = np.mean([v[key] for v in high]) / np.mean([v[key] for v in low])
            lines.append(f"{key}, lag > 5 against lag <= 5: {ratio:.2f}x ({len(high)} and {len(low)} runs)")
    write_table(args.out, lines)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=110)
    lag = [values["policy_lag_mean"] for _, _, values in rows]
    panels = {"loss/baseline": "value loss (V-trace targets)", "value/explained_variance": "explained variance "
              "(V-trace targets)", "value_mse": "final agent's value MSE (returns that followed)"}
    for ax, (key, label) in zip(axes, panels.items()):
        ax.scatter(lag, [values[key] for _, _, values in rows])
        ax.set_xlabel("policy lag (versions, mean over the second half)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    figure.suptitle(f"IMPALA on {args.env}: value error against policy lag (queue depths {args.rollout_slots})")
    figure.tight_layout()
    figure.savefig(args.out / "lag.png")
    print(args.out / "lag.png")


if __name__ == "__main__":
    main()
