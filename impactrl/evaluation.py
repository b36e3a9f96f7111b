"""Play whole episodes with a checkpointed agent: ``impactrl eval``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import yaml

from impactrl.build import env_options, make_agent
from impactrl.checkpoint import load_checkpoint
from impactrl.config import TrainConfig, coerce, with_values
from impactrl.envs import make_env
from impactrl.errors import UserError
from impactrl.models import AgentInput

VIDEO_FPS = 30


class EpisodeVideos:
    """The first env's episodes as ``DIR/episode-NNN.mp4`` (OpenCV's MPEG-4 writer, RGB frames from
    ``env.render()``)."""

    def __init__(self, directory: Path, env):
        self.directory = Path(directory)
        self.env = env
        self.frames: list[np.ndarray] = []
        self.written: list[Path] = []
        try:
            self.capture()
        except Exception as error:  # noqa: BLE001 - a renderer's missing package or unsupported mode
            raise UserError(f"--video: cannot render {env.spec.id if env.spec else 'this env'} as frames: "
                            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from None

    def capture(self) -> None:
        self.frames.append(np.asarray(self.env.render()))

    def finish_episode(self) -> None:
        import cv2

        path = self.directory / f"episode-{len(self.written):03d}.mp4"
        height, width = self.frames[0].shape[:2]
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), VIDEO_FPS, (width, height))
        for frame in self.frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        self.written.append(path)
        self.frames = []


def evaluate_checkpoint(path: Path, episodes: int, seed: int = 12345, greedy: bool = False,
                        num_envs: int = 8, video_dir: Path | None = None) -> dict:
    """Mean and std of the undiscounted return over ``episodes`` whole episodes; with
    ``video_dir``, the first env's episodes as mp4 files there."""
    state = load_checkpoint(path)
    config = with_values(TrainConfig(), coerce(yaml.safe_load(state["config"]), "checkpoint config"))
    torch.manual_seed(seed)
    num_envs = min(num_envs, episodes)
    options = env_options(config)
    if video_dir is not None:
        options = dataclasses.replace(options, render_mode="rgb_array")
    envs = [make_env(config.env, options, seed=seed + i, training=False) for i in range(num_envs)]
    agent = make_agent(config, envs[0].observation_space, envs[0].action_space)
    agent.load_state_dict(state["agent"])
    agent.eval()
    head = agent.policy_head
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    videos = None
    if video_dir is not None:
        Path(video_dir).mkdir(parents=True, exist_ok=True)
        videos = EpisodeVideos(video_dir, envs[0])
    first = torch.ones(num_envs, dtype=torch.bool)
    prev_action = torch.zeros((num_envs, *head.action_shape), dtype=head.action_dtype)
    prev_reward = torch.zeros(num_envs)
    core_state = agent.initial_state(num_envs)
    returns: list[float] = []
    # An env only starts a new episode while more are needed, so fast envs don't bias the mean.
    started = num_envs
    active = np.ones(num_envs, dtype=bool)
    with torch.inference_mode():
        while len(returns) < episodes:
            inputs = AgentInput(torch.from_numpy(obs)[None], prev_action[None], prev_reward[None], first[None])
            output, core_state = agent(inputs, core_state)
            policy = output.policy[0]
            action = head.mode(policy) if greedy else head.sample(policy)
            first = torch.zeros(num_envs, dtype=torch.bool)
            for i, env in enumerate(envs):
                if not active[i]:
                    continue
                obs[i], reward, terminated, truncated, info = env.step(action[i].numpy())
                prev_reward[i] = float(reward)
                if videos is not None and i == 0:
                    videos.capture()
                if terminated or truncated:
                    returns.append(float(info["episode"]["r"]))
                    if videos is not None and i == 0:
                        videos.finish_episode()
                    if started < episodes:
                        started += 1
                        obs[i] = env.reset()[0]
                        first[i] = True
                        if videos is not None and i == 0:
                            videos.capture()
                    else:
                        active[i] = False
            prev_action = torch.where(first.view(-1, *[1] * len(head.action_shape)), torch.zeros_like(action), action)
            prev_reward = torch.where(first, torch.zeros_like(prev_reward), prev_reward)
    for env in envs:
        env.close()
    returns_array = np.asarray(returns[:episodes])
    return {
        "return_mean": float(returns_array.mean()),
        "return_std": float(returns_array.std()),
        "episodes": int(len(returns_array)),
        "env": config.env,
        "env_steps_trained": int(state["learner"]["env_steps"]),
        "greedy": greedy,
        **({"videos": [str(path) for path in videos.written]} if videos is not None else {}),
    }
