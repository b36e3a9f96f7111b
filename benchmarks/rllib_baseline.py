"""RLlib's APPO and IMPALA on the envs impactrl is measured on, with the same env workers.

Runs inside its own virtual environment (RLlib pins gymnasium 1.2.2); `run.sh` builds it.

    python benchmarks/rllib_baseline.py --algo APPO --env CartPole-v1 --seconds 120 --target-return 450

Prints one JSON line: env steps/s after the warm-up and, with --target-return, the wall time at
which the mean return of the latest episodes first reached it. Observations come from impactrl's
own make_env (same preprocessing), transposed to channels-last float32 in [0, 1] for RLlib's CNN encoder.
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import numpy as np


class ChannelsLastFloat(gym.ObservationWrapper):
    """Channels-last float32 images in [0, 1]: RLlib's CNN encoder neither casts nor scales."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.observation_space
        self.scale = 1.0 / float(space.high.max())
        low = np.moveaxis(space.low, 0, -1).astype(np.float32) * self.scale
        high = np.moveaxis(space.high, 0, -1).astype(np.float32) * self.scale
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation):
        return np.moveaxis(observation, 0, -1).astype(np.float32) * self.scale


def make(config: dict) -> gym.Env:
    from impactrl.envs import make_env

    env = make_env(config["env_id"], training=True)
    return ChannelsLastFloat(env) if len(env.observation_space.shape) == 3 else env


def model_config(env_id: str) -> dict:
    if env_id.startswith("MinAtar/"):
        return {"conv_filters": [[16, [3, 3], 1]], "head_fcnet_hiddens": [128]}
    if env_id.startswith("ALE/"):  # the IMPALA shallow CNN
        return {"conv_filters": [[16, [8, 8], 4], [32, [4, 4], 2]], "head_fcnet_hiddens": [256]}
    return {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=["APPO", "IMPALA"], default="APPO")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-runners", type=int, default=2)
    parser.add_argument("--envs-per-runner", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--warmup-seconds", type=float, default=20.0)
    parser.add_argument("--target-return", type=float)
    args = parser.parse_args()
    script_start = time.perf_counter()

    import ray
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.tune.registry import register_env

    ray.init(num_cpus=args.env_runners + 1, include_dashboard=False, log_to_driver=False)
    register_env("impactrl_env", make)
    config = (APPOConfig() if args.algo == "APPO" else IMPALAConfig())
    config = (config.environment("impactrl_env", env_config={"env_id": args.env})
              .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=args.envs_per_runner)
              .learners(num_learners=0)
              .rl_module(model_config=model_config(args.env)))
    algo = config.build_algo()
    began = time.perf_counter()
    warm_steps = warm_time = None
    reached_s = None
    steps = 0
    while time.perf_counter() - began < args.seconds:
        result = algo.train()
        runners = result.get("env_runners", {})
        steps = runners.get("num_env_steps_sampled_lifetime", result.get("num_env_steps_sampled_lifetime", steps))
        elapsed = time.perf_counter() - began
        if warm_steps is None and elapsed >= args.warmup_seconds:
            warm_steps, warm_time = steps, elapsed
        episode_return = runners.get("episode_return_mean")
        if (reached_s is None and args.target_return is not None and episode_return is not None
                and episode_return >= args.target_return):
            reached_s = elapsed
            break
    elapsed = time.perf_counter() - began
    steady = (steps - warm_steps) / (elapsed - warm_time) if warm_steps is not None and elapsed > warm_time else None
    print(json.dumps({"system": f"rllib-{args.algo.lower()}", "env": args.env, "env_runners": args.env_runners,
                      "envs_per_worker": args.envs_per_runner,
                      "env_steps_per_s": steady, "env_steps": steps, "wall_s": elapsed,
                      "time_to_target_s": reached_s, "target_return": args.target_return,
                      "startup_s": began - script_start}), flush=True)
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
