"""Which of a torso's ReLU units are silent, on varied frames (issue "Beyond Pong": Space Invaders).

    python experiments/dead_units.py CHECKPOINT_OR_RUN [...] [--frames 512]
    python experiments/dead_units.py --fresh ALE/SpaceInvaders-v5 [--torso shallow_cnn] [--seeds 5]

The learner's ``torso/dead_units_*`` count units that are zero on every observation of one batch,
8 unrolls of consecutive frames: at the first metrics lines, frames near the games' start, it
reads 43-63% for the last layer where varied frames show 1-2%. This script plays random actions
for ``8 x --frames`` steps (whole games, Gymnasium), keeps every 8th frame, and prints per ReLU
layer the share of units zero on all of them, and the share of the last layer's units active on
under 1% of them. ``--fresh`` builds untrained agents (one per seed, the observation mean taken
from the same frames, as the learner's first update does) instead of loading checkpoints.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

from impactrl.envs.factory import EnvOptions, make_env
from impactrl.evaluation import load_agent
from impactrl.models import build_agent


def random_play_frames(env_id: str, count: int, seed: int = 0) -> tuple[torch.Tensor, tuple[gym.Space, gym.Space]]:
    """``count`` frames of random play, every 8th, and the env's observation and action spaces."""
    env = make_env(env_id, EnvOptions(sticky_action_prob=0.0), seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    frames = []
    while len(frames) < count * 8:
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        frames.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return torch.as_tensor(np.stack(frames[::8])), (env.observation_space, env.action_space)


def silent_units(agent, frames: torch.Tensor) -> tuple[list[float], float]:
    """Per ReLU layer the share of units zero on every frame; the last layer's share active on < 1%."""
    with torch.no_grad():
        features = agent.torso(agent.obs_norm(frames) if agent.obs_norm is not None else frames)
    return agent.dead_unit_fractions(frames), float(((features > 0).float().mean(0) < 0.01).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoints", nargs="*", help="checkpoint files or run directories (their latest)")
    parser.add_argument("--fresh", metavar="ENV_ID", help="untrained agents for this env instead")
    parser.add_argument("--torso", default="shallow_cnn", help="with --fresh (default shallow_cnn)")
    parser.add_argument("--seeds", type=int, default=5, help="with --fresh: agents to average (default 5)")
    parser.add_argument("--frames", type=int, default=512)
    args = parser.parse_args()
    if bool(args.fresh) == bool(args.checkpoints):
        parser.error("give checkpoints or --fresh ENV_ID, not both")
    print("| agent | env steps | zero on every frame, per ReLU layer | last layer active on < 1% |")
    print("|---|---|---|---|")
    if args.fresh:
        frames, spaces = random_play_frames(args.fresh, args.frames)
        results = []
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            agent = build_agent(*spaces, torso=args.torso, normalize_observations=True)
            agent.obs_norm.update(frames)
            results.append(silent_units(agent, frames))
        layers = np.mean([layers for layers, _ in results], axis=0)
        rare = np.mean([rare for _, rare in results])
        print(f"| fresh {args.torso}, {args.seeds} seeds | 0 | {', '.join(f'{x:.3f}' for x in layers)} | {rare:.3f} |")
        return
    for path in args.checkpoints:
        agent, config, _, state = load_agent(path)
        layers, rare = silent_units(agent, random_play_frames(config.env, args.frames)[0])
        print(f"| {path} | {int(state['learner']['env_steps'])} | {', '.join(f'{x:.3f}' for x in layers)} | {rare:.3f} |")


if __name__ == "__main__":
    main()
