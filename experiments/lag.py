"""Claim (6): policy lag makes the value error worse (the IMPALA document: above 5 versions, the
"traditional" method's value error about 3x worse on Pong).

    python experiments/lag.py --out runs/lag [--env MinAtar/Breakout-v1] [--lag-flag rollout-slots]
        [--levels 3,6,12,24,48] [--corrections vtrace,none] [--seeds 1,2,3] [--steps 1000000]
        [--num-actors 2] [--episodes 100] [--extra "FLAGS"]

The lag is set by one flag, at each of ``--levels``. ``--rollout-slots``, the depth of the rollout
queue: with the learner the slower side (as on MinAtar here), actors keep every slot full, so an
unroll waits behind the others and the learner trains on it that many versions later.
``--publish-interval``: actors get new weights every N updates, whichever side is slower (as on Pong
with one actor, where the learner waits for data). Each level runs with V-trace and, with
``--corrections vtrace,none``, without the correction (``--off-policy-correction none``, the
traditional actor-critic the document compares with). One IMPALA run per level, correction and seed,
everything else fixed. Writes ``lag.png`` and ``table.md``: against the measured policy lag, the
value loss and explained variance against the training targets (V-trace's, or without the
correction n-step returns) over the second half of each run (after the early learning), and the
final agent's value error against the discounted returns that followed in ``--episodes`` evaluation
episodes (``impactrl eval``: V-trace targets lean on the learner's own value function, the returns
that followed do not).
"""

from __future__ import annotations

import argparse
import shlex
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
    parser.add_argument("--lag-flag", choices=("rollout-slots", "publish-interval"), default="rollout-slots",
                        help="the impactrl train flag that sets the lag (default rollout-slots)")
    parser.add_argument("--levels", default="3,6,12,24,48", help="the lag flag's values (default 3,6,12,24,48)")
    parser.add_argument("--corrections", default="vtrace",
                        help="--off-policy-correction of the runs: vtrace, none or both (default vtrace)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--num-actors", type=int, default=2)
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes per run (default 100)")
    parser.add_argument("--extra", default="", help="more impactrl train flags for every run, e.g. '--env-backend envpool'")
    args = parser.parse_args()
    levels = [int(level) for level in args.levels.split(",")]
    corrections = args.corrections.split(",")
    if not set(corrections) <= {"vtrace", "none"}:
        parser.error(f"--corrections {args.corrections}: each is vtrace or none")
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for correction in corrections:
        for level in levels:
            for seed in seeds:
                run_dir = args.out / f"{correction}-{args.lag_flag}{level}-s{seed}"
                train(run_dir, args.steps, ["--algo", "impala", "--env", args.env, "--seed", str(seed),
                                            "--num-actors", str(args.num_actors), f"--{args.lag_flag}", str(level),
                                            "--off-policy-correction", correction, *shlex.split(args.extra)])
                values = second_half_means(read_records(run_dir), args.steps)
                evaluation = evaluate(run_dir, args.episodes)
                values.update({key: evaluation[key] for key in EVALUATED})
                rows.append((correction, level, seed, values))
    lines = [f"| correction | {args.lag_flag} | seed | policy lag | value loss (training targets) "
             "| explained variance (training targets) | training return | value MSE (returns that followed) "
             "| explained variance (returns that followed) |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {correction} | {level} | {seed} | " + " | ".join(f"{values[key]:.3f}" for key in (*METRICS, *EVALUATED))
              + " |" for correction, level, seed, values in rows]
    lines.append("")
    for correction in corrections:
        low = [values for c, _, _, values in rows if c == correction and values["policy_lag_mean"] <= 5]
        high = [values for c, _, _, values in rows if c == correction and values["policy_lag_mean"] > 5]
        if low and high:
            for key in ("loss/baseline", "value_mse"):
                ratio = np.mean([v[key] for v in high]) / np.mean([v[key] for v in low])
                lines.append(f"{correction}: {key}, lag > 5 against lag <= 5: {ratio:.2f}x "
                             f"({len(high)} and {len(low)} runs)")
    write_table(args.out, lines)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8), dpi=110)
    panels = {"loss/baseline": "value loss (training targets)", "value/explained_variance": "explained variance "
              "(training targets)", "value_mse": "final agent's value MSE (returns that followed)"}
    for ax, (key, label) in zip(axes, panels.items()):
        for correction in corrections:
            chosen = [values for c, _, _, values in rows if c == correction]
            ax.scatter([values["policy_lag_mean"] for values in chosen], [values[key] for values in chosen],
                       label=f"--off-policy-correction {correction}")
        ax.set_xlabel("policy lag (versions, mean over the second half)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(f"IMPALA on {args.env}: value error against policy lag (--{args.lag_flag} {args.levels})")
    figure.tight_layout()
    figure.savefig(args.out / "lag.png")
    print(args.out / "lag.png")


if __name__ == "__main__":
    main()
