"""What a run's training signals did when it started and around each collapse (issue: Pong).

    python experiments/collapse.py RUN [RUN ...] [--high 15] [--floor 0] [--start-steps 200000]

Per run, from its metrics.jsonl:
- the start: per 50k env steps up to ``--start-steps``, the first convolution's dead share and
  its update size (‖Δθ‖ / ‖θ‖ per optimiser step), the gradient norm and the policy's entropy;
- the end: the 100-game mean reached, and the first convolution's dead share;
- every collapse: the 100-game mean had passed ``--high`` and then fell below ``--floor``. For
  each, the signals averaged over windows before the fall began (its last 100-game peak), during
  the fall and after it: entropy, importance weights (V-trace's ρ for IMPALA, IMPACT's truncated
  weight against the target network), gradient norm, value explained variance, policy lag.

Prints one markdown table per part; nothing is trained.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from common import hundred_episode_means
from impactrl.plotting import read_records

SIGNALS = {  # column: the metrics keys that carry it (IMPALA's, IMPACT's)
    "entropy": ("loss/entropy",),
    "IS weight mean": ("vtrace/rho_mean", "impact/is_weight_mean"),
    "IS weight clipped": ("vtrace/rho_clipped_fraction", "impact/is_weight_clipped_fraction"),
    "ratio clipped": ("impact/clip_fraction",),
    "grad norm": ("optim/grad_norm",),
    "value EV": ("value/explained_variance",),
    "lag": ("policy_lag_mean",),
}
START_SIGNALS = {"first conv dead": ("torso/dead_units_first_layer",),
                 "first conv update": ("optim/first_layer_update_ratio",),
                 "grad norm": ("optim/grad_norm",), "entropy": ("loss/entropy",)}
WINDOWS = ((-500_000, -250_000, "peak −500k…−250k"), (-250_000, 0, "peak −250k…peak"))


def window_mean(records: list[dict], keys: tuple[str, ...], low: float, high: float) -> float:
    """The mean of the first of ``keys`` logged in ``[low, high)`` env steps (NaN if none)."""
    for key in keys:
        values = [r[key] for r in records if low <= r["env_steps"] < high and r.get(key) is not None]
        if values:
            return float(np.mean(values))
    return float("nan")


def collapses(means: list[tuple[int, float]], high: float, floor: float) -> list[tuple[int, int, int]]:
    """(peak, below floor, recovered past high or the run's end) env steps of each fall below
    ``floor`` after the 100-game mean had passed ``high``."""
    found, armed, peak = [], False, (0, -np.inf)
    for index, (steps, mean) in enumerate(means):
        if mean >= high:
            armed = True
        if armed and mean >= peak[1]:
            peak = (steps, mean)
        if armed and mean < floor:
            back = next((s for s, m in means[index:] if m >= high), means[-1][0])
            found.append((peak[0], steps, back))
            armed, peak = False, (0, -np.inf)
    return found


def row(cells: list) -> str:
    return "| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells) + " |"


def start_table(runs: list[Path], start_steps: int) -> list[str]:
    lines = [row(["run", "env steps", *START_SIGNALS]), row(["---"] * (2 + len(START_SIGNALS)))]
    for run in runs:
        records = read_records(run)
        for low in range(0, start_steps, 50_000):
            lines.append(row([run.name, f"{low // 1000}k–{(low + 50_000) // 1000}k",
                              *(window_mean(records, keys, low, low + 50_000) for keys in START_SIGNALS.values())]))
    return lines


def end_table(runs: list[Path], high: float, floor: float) -> list[str]:
    lines = [row(["run", "env steps", "best 100-game mean", "last 100", "first conv dead at end",
                  f"falls below {floor:g} after {high:g}"]), row(["---"] * 6)]
    for run in runs:
        records = read_records(run)
        means = hundred_episode_means(records)
        dead = [r["torso/dead_units_first_layer"] for r in records if r.get("torso/dead_units_first_layer") is not None]
        lines.append(row([run.name, f"{records[-1]['env_steps']:,}",
                          max((m for _, m in means), default=float("nan")), means[-1][1] if means else float("nan"),
                          f"{dead[-1]:.0%}" if dead else "-", len(collapses(means, high, floor))]))
    return lines


def collapse_table(runs: list[Path], high: float, floor: float) -> list[str]:
    lines = [row(["run", "peak → below floor → back", "window", *SIGNALS]), row(["---"] * (3 + len(SIGNALS)))]
    for run in runs:
        records = read_records(run)
        for peak, fell, back in collapses(hundred_episode_means(records), high, floor):
            windows = [*WINDOWS, (0, fell - peak, "peak…below floor"), (fell - peak, back - peak, "below floor…back")]
            for low, high_end, label in windows:
                lines.append(row([run.name, f"{peak:,} → {fell:,} → {back:,}", label,
                                  *(window_mean(records, keys, peak + low, peak + high_end) for keys in SIGNALS.values())]))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--high", type=float, default=15.0, help="a collapse counts after the 100-game mean passed this")
    parser.add_argument("--floor", type=float, default=0.0, help="... and then fell below this")
    parser.add_argument("--start-steps", type=int, default=200_000)
    args = parser.parse_args()
    for lines in (start_table(args.runs, args.start_steps), end_table(args.runs, args.high, args.floor),
                  collapse_table(args.runs, args.high, args.floor)):
        print("\n".join(lines), end="\n\n")


if __name__ == "__main__":
    main()
