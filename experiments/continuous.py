"""Claim (2): on continuous control IMPACT keeps synchronous PPO's sample efficiency and trains faster.

    python experiments/continuous.py --out runs/continuous [--envs Hopper-v5,HalfCheetah-v5,Walker2d-v5]
        [--algos impact,ppo,impala] [--seeds 1,2] [--steps 1000000]

Each algorithm with its MuJoCo presets (IMPACT: the paper's N=16, K=20; PPO: CleanRL's recipe),
2 actors. Humanoid: ``--envs Humanoid-v5 --steps 2000000``. Writes ``ENV-steps.png``,
``ENV-time.png`` and ``table.md`` as experiments/discrete.py does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import compare_algorithms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/continuous"))
    parser.add_argument("--envs", default="Hopper-v5,HalfCheetah-v5,Walker2d-v5")
    parser.add_argument("--algos", default="impact,ppo,impala")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--steps", type=int, default=1_000_000)
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    compare_algorithms(args.out, args.envs.split(","), args.algos.split(","), seeds, args.steps, ["--num-actors", "2"])


if __name__ == "__main__":
    main()
