"""Claims (4) and (5): IMPACT without its target network or its truncated IS weight does worse,
and the paper's buffer (N=1, K=2 discrete; N=16, K=20 continuous) is the best setting; and
IMPACT's learner training on held batches while it waits for new data against waiting for a free
place in its buffer.

    python experiments/ablations.py --out runs/ablations [--env MinAtar/Breakout-v1] [--seeds 1,2,3]
        [--steps 1000000] [--buffer NxK] [--variants impact,no-target-network,...] [--buffers 1x1,1x4,2x2,4x2]

Variants of IMPACT (with its presets for the env's family, at the ``--buffer`` N×K if given): the
full algorithm (``impact``); no target network (``no-target-network``: ratios against the
behaviour policy); no truncation of the IS weight (``no-truncated-is``); the learner taking every
batch as soon as it is ready and training on the held ones in between (``fetch-ready``:
``--buffer-fetch ready``, where the default waits for a free place); and every N×K in
``--buffers`` (for a MuJoCo env pass e.g. ``--buffers 16x20,8x20,16x10,4x5``). Writes
``ENV-steps.png``, ``ENV-time.png`` and ``table.md`` (with the policy lag) as
experiments/discrete.py does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import TABLE_HEADER, compare, write_table


def buffer_flags(point: str) -> list[str]:
    """``NxK`` as impactrl train flags."""
    n, k = point.split("x")
    return ["--buffer-batches", n, "--buffer-uses", k]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/ablations"))
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--buffer", help="N x K of every variant but the --buffers points (default: the preset's)")
    parser.add_argument("--variants", default="impact,no-target-network,no-truncated-is,fetch-ready")
    parser.add_argument("--buffers", default="1x1,1x4,2x2,4x2", help="N x K points besides the preset's, comma-separated")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    impact = ["--algo", "impact", "--num-actors", "2"]
    base = impact + (buffer_flags(args.buffer) if args.buffer else [])
    ablations = {
        "impact": base,
        "no-target-network": [*base, "--no-use-target-network"],
        "no-truncated-is": [*base, "--target-worker-clip", "None"],
        "fetch-ready": [*base, "--buffer-fetch", "ready"],
    }
    names = list(filter(None, args.variants.split(",")))
    if unknown := [name for name in names if name not in ablations]:
        parser.error(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(ablations)})")
    variants = {name: ablations[name] for name in names}
    for point in filter(None, args.buffers.split(",")):
        n, k = point.split("x")
        variants[f"N{n}-K{k}"] = [*impact, *buffer_flags(point)]
    lines = TABLE_HEADER + compare(args.out, args.env, variants, seeds, args.steps,
                                   f"IMPACT ablations on {args.env}, seeds {args.seeds}")
    write_table(args.out, lines)


if __name__ == "__main__":
    main()
