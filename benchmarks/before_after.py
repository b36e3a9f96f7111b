"""Env steps/s of two installs of impactrl, ``impactrl bench`` run in turn (A B A B ...) so a
machine whose speed drifts slows both alike.

    python benchmarks/before_after.py --a .venv/bin/impactrl --b OLD_VENV/bin/impactrl \
        [--rounds 3] [--seconds 30] [--envs CartPole-v1,MinAtar/Breakout-v1,ALE/Pong-v5]

Each install runs from its own environment (an editable install shadows PYTHONPATH, so the old
code needs a virtual environment of its own: ``pip install --no-deps /path/to/old/checkout``).
Every bench runs from a scratch directory, so neither picks up the other's source tree. Prints
per env each round's pair and the median of the ratios A/B.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile

RATE = re.compile(r"([\d,]+) env steps/s")


def bench(impactrl: str, env: str, seconds: int, extra: list[str]) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        output = subprocess.run([impactrl, "bench", "--env", env, "--seconds", str(seconds), "--warmup-seconds", "10",
                                 *extra], cwd=scratch, capture_output=True, text=True, check=True).stdout
    return float(RATE.findall(output)[-1].replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="the impactrl command of install A (the change)")
    parser.add_argument("--b", required=True, help="the impactrl command of install B (the baseline)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--envs", default="CartPole-v1,MinAtar/Breakout-v1,ALE/Pong-v5")
    args = parser.parse_args()
    for env in args.envs.split(","):
        extra = ["--env-backend", "envpool"] if env.startswith("ALE/") else []
        ratios = []
        for round_ in range(args.rounds):
            a, b = bench(args.a, env, args.seconds, extra), bench(args.b, env, args.seconds, extra)
            ratios.append(a / b)
            print(f"{env} round {round_ + 1}: A {a:,.0f}  B {b:,.0f}  A/B {a / b:.2f}", flush=True)
        print(f"{env}: median A/B {statistics.median(ratios):.2f} over {args.rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
