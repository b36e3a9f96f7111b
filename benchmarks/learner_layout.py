"""The learner's SGD step with the torsos' convolutions contiguous (NCHW) against channels-last
(NHWC), the layout a CPU learner uses for the Atari nets (``learner_channels_last``).

    python benchmarks/learner_layout.py --env ALE/Pong-v5 --algo impala --steps 30

Both learners start from the same weights and train on one fixed random batch of the preset's
shape, alternating step by step so a noisy machine slows both alike. Prints one JSON line with
the milliseconds per step of each and the largest weight difference at the end (float rounding).
"""

from __future__ import annotations

import json
import time

import torch
from learner_overhead import learner_benchmark_parser, random_batch

from impactrl.algos import make_algorithm
from impactrl.build import make_agent, run_tasks
from impactrl.cli import resolve_train_config
from impactrl.models.torsos import learner_channels_last
from impactrl.runtime.learner import Learner


def main() -> None:
    args = learner_benchmark_parser(__doc__, "ALE/Pong-v5", 30).parse_args()
    torch.set_num_threads(args.threads)
    config = resolve_train_config(["--algo", args.algo, "--env", args.env, "--no-lr-decay"]).config
    tasks = run_tasks(config)
    learners = {}
    for layout in ("contiguous", "channels_last"):
        torch.manual_seed(0)
        agent = make_agent(config, tasks)
        if layout == "channels_last":
            learner_channels_last(agent)
        learners[layout] = Learner(config, agent, make_algorithm(config, agent), torch.device("cpu"))
    batch = random_batch(config, learners["contiguous"].agent, tasks)
    seconds = dict.fromkeys(learners, 0.0)
    for step in range(args.steps + 3):
        for layout, learner in learners.items():
            began = time.perf_counter()
            if learner.algorithm.wants_data():
                learner.add(batch)
            learner.update()
            if step >= 3:  # warm-up
                seconds[layout] += time.perf_counter() - began
    ms = {layout: 1000 * s / args.steps for layout, s in seconds.items()}
    first, second = (learner.agent.state_dict() for learner in learners.values())
    print(json.dumps({"env": args.env, "algo": args.algo, **{f"{k}_ms": round(v, 1) for k, v in ms.items()},
                      "speedup": round(ms["contiguous"] / ms["channels_last"], 2),
                      "max_weight_difference": max(float((first[k] - second[k]).abs().max()) for k in first
                                                   if first[k].is_floating_point())}))


if __name__ == "__main__":
    main()
