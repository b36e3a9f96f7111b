"""Play whole episodes with a checkpointed agent: ``impactrl eval``."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import yaml

from impactrl.acting import Acting
from impactrl.build import env_options, env_tasks, make_agent, run_tasks
from impactrl.checkpoint import load_checkpoint
from impactrl.config import TrainConfig, coerce, with_values
from impactrl.envs import make_env
from impactrl.envs.factory import EnvOptions, env_family, env_spec
from impactrl.envs.tasks import TaskSet, pad_observation, tasks_family
from impactrl.envs.vector import ALE_MAX_FRAMES
from impactrl.errors import UserError
from impactrl.models import DEAD_UNIT_SAMPLE, Agent
from impactrl.ops.returns import discounted_returns, explained_variance

VIDEO_FPS = 30
DEAD_UNIT_EVERY = 8  # steps between the observations sampled for the dead-unit count: spread over the games
DEFAULT_EPISODE_STEPS = 100_000  # the cap on an episode of an env that has no time limit of its own
PROGRESS_EVERY_S = 10.0  # a progress line this often on stderr when it is not a terminal
BAR_EVERY_S = 0.5  # the progress bar's redraws on a terminal
NORMALIZE_EPSILON = 1e-8  # Gymnasium's NormalizeReward adds it to the variance (make_env keeps its default)


def episode_step_limit(env_id: str, config: TrainConfig) -> int | None:
    """The most agent steps an episode of ``env_id`` lasts in a run with ``config``: its
    ``max_episode_steps``, else for Atari the 108,000 emulator frames the v5 games stop at (the
    Atari papers' evaluation limit), else the env's registered time limit; None when nothing ends it."""
    if config.max_episode_steps is not None:
        return config.max_episode_steps
    if env_family(env_id) == "atari":
        return ALE_MAX_FRAMES // config.frame_skip
    return env_spec(env_id).max_episode_steps


class StepCap(gym.Wrapper):
    """Truncates an episode at ``cap`` steps where the env itself has not ended it, as a time limit
    would; that step's ``info`` then holds the return so far as ``episode`` and ``cut``."""

    def __init__(self, env: gym.Env, cap: int):
        super().__init__(env)
        self.cap = cap
        self.steps, self.episode_return = 0, 0.0

    def reset(self, **kwargs):
        self.steps, self.episode_return = 0, 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.episode_return += float(reward)
        if self.steps >= self.cap and not (terminated or truncated):
            truncated = True
            info = {**info, "episode": {"r": self.episode_return, "l": self.steps}, "cut": True}
        return observation, reward, terminated, truncated, info


class Progress:
    """How far a long evaluation got, on stderr: a bar over the episodes on a terminal, else a line
    every ``PROGRESS_EVERY_S``; and one-line notes."""

    def __init__(self, label: str, episodes: int):
        self.label, self.episodes = label, episodes
        self.began = self.shown = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=episodes, desc=label, unit="ep", file=sys.stderr, leave=False)

    def update(self, episodes: int, steps: int) -> None:
        now = time.monotonic()
        if now - self.shown < (BAR_EVERY_S if self.bar is not None else PROGRESS_EVERY_S):
            return
        self.shown = now
        if self.bar is not None:
            self.bar.n = episodes
            self.bar.set_postfix_str(f"{steps:,} steps")
        else:
            print(f"impactrl eval: {self.label}: {episodes}/{self.episodes} episodes, {steps:,} env steps in "
                  f"{now - self.began:.0f} s", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(f"impactrl eval: {text}", file=sys.stderr)
        else:
            print(f"impactrl eval: {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def video_directory(path: Path) -> Path:
    """``path``, made if missing and checked writable before any episode is played; UserError
    when it cannot be."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"--video {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as error:
        raise UserError(f"--video {path}: cannot write there ({error.strerror or error})") from None
    return path


class EpisodeVideos:
    """The first env's episodes as ``DIR/episode-NNN.mp4`` (OpenCV's MPEG-4 writer, RGB frames from
    ``env.render()``)."""

    def __init__(self, directory: Path, env):
        self.directory = Path(directory)
        self.env = env
        self.frames: list[np.ndarray] = []
        self.written: list[Path] = []
        env_id = env.spec.id if env.spec else "this env"
        try:
            self.capture()
        except Exception as error:  # noqa: BLE001 - a renderer's missing package or unsupported mode
            # Gymnasium wraps the ImportError of a missing renderer (pygame for classic control).
            missing = next((e.name for e in (error, error.__cause__) if isinstance(e, ImportError) and e.name), None)
            if missing is not None:
                hint = 'pip install -e ".[video]" (or pip install pygame)' if missing == "pygame" else f"pip install {missing}"
                raise UserError(f"--video: rendering {env_id} needs the {missing} package: {hint}") from None
            raise UserError(f"--video: cannot render {env_id} as frames: "
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


class MonteCarloValues:
    """The agent's value V(x_t) at every step of the played episodes beside the discounted return
    that followed, G_t = r_t + γ_t G_{t+1} (``discounted_returns``), in the terms the value was
    trained in: rewards clipped as in training, γ_t = 0 where the episode ended and, when training
    ended episodes at a lost life (Atari's episodic life), there too; a truncated episode
    bootstraps from the value of its final observation.

    Their gap is the value error of the evaluated policy's own returns, which the V-trace value
    loss cannot show: its targets lean on the same value function."""

    def __init__(self, num_envs: int, discount: float, clip_rewards: bool, life_ends: bool):
        self.discount = discount
        self.clip_rewards = clip_rewards
        self.life_ends = life_ends
        self.episode_steps: list[list[tuple[float, float, float]]] = [[] for _ in range(num_envs)]
        self.lives: list[int | None] = [None] * num_envs
        self.values: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def step(self, env_index: int, value: float, reward: float, terminated: bool, info: dict) -> None:
        lives = info.get("lives") if self.life_ends else None
        life_lost = lives is not None and self.lives[env_index] is not None and lives < self.lives[env_index]
        self.lives[env_index] = lives
        reward = float(np.clip(reward, -1.0, 1.0)) if self.clip_rewards else float(reward)
        self.episode_steps[env_index].append((value, reward, 0.0 if terminated or life_lost else self.discount))

    def end_episode(self, env_index: int, bootstrap_value: float) -> None:
        steps = torch.tensor(self.episode_steps[env_index], dtype=torch.float64)
        self.episode_steps[env_index], self.lives[env_index] = [], None
        returns = discounted_returns(steps[:, 1:2], steps[:, 2:3], torch.tensor([bootstrap_value], dtype=torch.float64))
        self.values.append(steps[:, 0])
        self.targets.append(returns[:, 0])

    def summary(self) -> dict:
        """``value_mse``: mean of (V(x_t) − G_t)² over every step; ``value_explained_variance``:
        1 − Var[G − V] / Var[G]."""
        values, targets = torch.cat(self.values), torch.cat(self.targets)
        return {"value_mse": float(((values - targets) ** 2).mean()),
                "value_explained_variance": float(explained_variance(values, targets))}


@dataclasses.dataclass
class Played:
    returns: list[float]
    cut: int  # episodes cut at the step cap
    videos: list[str]
    value_error: dict  # MonteCarloValues.summary(), or both entries None where it would mislead
    dead_units: list[float]  # the torso's dead_unit_fractions on a sample of the observations played


def load_agent(path: Path) -> tuple[Agent, TrainConfig, TaskSet, dict]:
    """A checkpoint's agent in eval mode, its run's config (on Gymnasium: evaluation plays whole
    games there), the run's tasks and the checkpoint itself."""
    state = load_checkpoint(path)
    config = with_values(TrainConfig(), coerce(yaml.safe_load(state["config"]), "checkpoint config"))
    config = with_values(config, {"env_backend": "gymnasium"})
    tasks = run_tasks(config)
    agent = make_agent(config, tasks)
    agent.load_state_dict(state["agent"])
    agent.eval()
    return agent, config, tasks, state


def evaluate_checkpoint(path: Path, episodes: int, seed: int = 12345, greedy: bool = False,
                        num_envs: int = 8, video_dir: Path | None = None,
                        references: Sequence[Path] = (), sticky_action_prob: float | None = None,
                        max_episode_steps: int | None = None) -> dict:
    """Mean and std of the undiscounted return over ``episodes`` whole episodes, and the value
    error against the returns that followed (``MonteCarloValues``; null with ``greedy``, whose
    policy is not the one the value estimates, and with normalised rewards, whose scale differs
    per env), ``torso_dead_units`` (the torso's ``dead_unit_fractions`` on up to ``DEAD_UNIT_SAMPLE``
    of the observations played); with ``video_dir``, the first env's episodes as mp4 files there.

    An episode is cut after ``max_episode_steps`` agent steps (default: ``episode_step_limit``, else
    ``DEFAULT_EPISODE_STEPS``) with its return so far, a line on stderr and ``episodes_cut`` counting it.

    A multi-task agent plays ``episodes`` on every task and the result has one entry per task,
    with the return of a uniform-random policy over the task's actions beside it, and
    ``score``: the mean over tasks of the normalised score (R − R_random) / (R_reference − R_random),
    where R_reference is the return of the single-task run in ``references`` on that task
    (evaluated the same way); null without references.
    """
    if max_episode_steps is not None and max_episode_steps < 1:
        raise UserError(f"--max-episode-steps must be >= 1, got {max_episode_steps}")
    if video_dir is not None:
        video_dir = video_directory(video_dir)
    agent, config, tasks, state = load_agent(path)
    options = play_options(config, sticky_action_prob, video_dir)
    evaluation = Evaluation(agent, config, state, tasks, options, episodes, seed, greedy, min(num_envs, episodes),
                            max_episode_steps)
    common = {"env": config.env, "env_steps_trained": int(state["learner"]["env_steps"]), "greedy": greedy,
              **({"noop_max": options.noop_max, "sticky_action_prob": options.sticky_action_prob,
                  "fire_reset": options.fire_reset} if tasks_family(config.env) == "atari" else {})}
    if tasks.multi_task:
        return {**evaluate_tasks(evaluation, references, video_dir, sticky_action_prob), **common}
    if references:
        raise UserError(f"--reference compares a multi-task agent with single-task runs, but {path} is a run on "
                        f"one task ({config.env})")
    entry, videos = evaluation.play(0, video_dir)
    return {**entry, **common, **({"videos": videos} if video_dir is not None else {})}


def play_options(config: TrainConfig, sticky_action_prob: float | None, video_dir: Path | None) -> EnvOptions:
    """The options of the envs evaluation plays: the run's, with ``sticky_action_prob`` (Atari only)
    and rendering for ``video_dir``."""
    options = env_options(config)
    if sticky_action_prob is not None:
        if tasks_family(config.env) != "atari":
            raise UserError(f"--sticky-action-prob is for Atari games, not {config.env}")
        options = dataclasses.replace(options, sticky_action_prob=sticky_action_prob)
    if video_dir is not None:
        options = dataclasses.replace(options, render_mode="rgb_array")
    return options


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """A checkpointed agent and how ``evaluate_checkpoint`` plays each of its tasks."""

    agent: Any
    config: TrainConfig
    state: dict  # the checkpoint
    tasks: TaskSet
    options: EnvOptions
    episodes: int
    seed: int
    greedy: bool
    num_envs: int
    max_episode_steps: int | None

    def play(self, task: int, video_dir: Path | None) -> tuple[dict, list[str]]:
        """Task ``task``'s episodes: their returns, the cut ones and the step cap, the value error
        and the dead units; and the videos written to ``video_dir``."""
        env_id = self.tasks.ids[task]
        cap = self.max_episode_steps or episode_step_limit(env_id, self.config) or DEFAULT_EPISODE_STEPS
        played = play(self.agent, self.config, eval_envs(env_id, self.options, self.seed, self.num_envs, cap), task,
                      tuple(self.tasks.observation_space.shape), self.episodes, self.seed, self.greedy, video_dir,
                      training_reward_scale(self.state, self.config, self.tasks, task))
        return ({**summarize_returns(played.returns), "episodes_cut": played.cut, "max_episode_steps": cap,
                 **played.value_error, "torso_dead_units": played.dead_units}, played.videos)


def evaluate_tasks(evaluation: Evaluation, references: Sequence[Path], video_dir: Path | None,
                   sticky_action_prob: float | None) -> dict:
    """A multi-task agent's evaluation (see ``evaluate_checkpoint``): per task, its entry with the
    random policy's return and the score against ``references``; the mean score."""
    reference_returns = task_reference_returns(evaluation, references, sticky_action_prob)
    per_task, scores = {}, []
    for task, (env_id, label) in enumerate(zip(evaluation.tasks.ids, evaluation.tasks.labels)):
        entry, videos = evaluation.play(task, None if video_dir is None else video_dir / label)
        random_return = float(np.mean(random_returns(env_id, evaluation.options, evaluation.episodes, evaluation.seed,
                                                     entry["max_episode_steps"])))
        entry.update({"env": env_id, "random_return_mean": random_return})
        if env_id in reference_returns:
            entry["reference_return_mean"] = reference_returns[env_id]
            spread = reference_returns[env_id] - random_return
            entry["score"] = (entry["return_mean"] - random_return) / spread if spread > 0 else None
            if entry["score"] is not None:
                scores.append(entry["score"])
        if video_dir is not None:
            entry["videos"] = videos
        per_task[label] = entry
    return {"tasks": per_task, "score": float(np.mean(scores)) if scores else None, "tasks_scored": len(scores),
            "tasks_above_random": sum(entry["return_mean"] > entry["random_return_mean"] for entry in per_task.values())}


def task_reference_returns(evaluation: Evaluation, references: Sequence[Path],
                           sticky_action_prob: float | None) -> dict[str, float]:
    """The mean return of each single-task run in ``references`` (evaluated like the agent), by env id."""
    returns = {}
    for reference in references:
        result = evaluate_checkpoint(reference, evaluation.episodes, evaluation.seed, evaluation.greedy,
                                     evaluation.num_envs, sticky_action_prob=sticky_action_prob,
                                     max_episode_steps=evaluation.max_episode_steps)
        if result["env"] not in evaluation.tasks.ids:
            raise UserError(f"--reference {reference}: a run on {result['env']}, not a single-task run on one of "
                            f"{', '.join(evaluation.tasks.ids)}")
        returns[result["env"]] = result["return_mean"]
    return returns


def summarize_returns(returns: list[float]) -> dict:
    values = np.asarray(returns)
    return {"return_mean": float(values.mean()), "return_std": float(values.std()), "episodes": int(len(values))}


def eval_envs(env_id: str, options, seed: int, num_envs: int, cap: int) -> list[gym.Env]:
    """``num_envs`` envs as evaluation plays them (whole games), env ``i`` seeded ``seed + i``, their
    episodes cut at ``cap`` steps."""
    return [StepCap(make_env(env_id, options, seed=seed + i, training=False), cap) for i in range(num_envs)]


def training_reward_scale(state: dict, config: TrainConfig, tasks: TaskSet, task: int) -> float | None:
    """What training divided task ``task``'s rewards by with --normalize-rewards (None without):
    the standard deviation of the discounted return as its envs' normalisers held it in the
    checkpoint ``state``, pooled over them (a fresh normaliser's 1 where none had reported)."""
    if not config.normalize_rewards:
        return None
    stats = np.asarray(state["reward_stats"])[env_tasks(config, tasks) == task]  # [envs, (mean, var, count)]
    stats = stats[np.isfinite(stats).all(axis=1)]
    if not len(stats):
        return float(np.sqrt(1.0 + NORMALIZE_EPSILON))
    mean, var, count = stats.T
    pooled_mean = (count * mean).sum() / count.sum()
    pooled_var = (count * (var + (mean - pooled_mean) ** 2)).sum() / count.sum()
    return float(np.sqrt(pooled_var + NORMALIZE_EPSILON))


def random_returns(env_id: str, options, episodes: int, seed: int, cap: int) -> list[float]:
    """Returns of a uniform-random policy over ``episodes`` whole episodes (the score's floor), cut
    at ``cap`` steps."""
    env = StepCap(make_env(env_id, options, seed=seed, training=False), cap)
    returns = []
    env.reset(seed=seed)
    while len(returns) < episodes:
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            env.reset()
    env.close()
    return returns


def play(agent, config: TrainConfig, envs: list, task: int, shape: tuple[int, ...], episodes: int, seed: int,
         greedy: bool, video_dir: Path | None, reward_scale: float | None = None) -> Played:
    """Play ``episodes`` whole episodes of task ``task`` on ``envs`` (closed at the end), their
    observations padded to ``shape``, their rewards fed back to the agent divided by
    ``reward_scale`` (see ``Acting``): the returns, the videos written (the first env's episodes,
    with ``video_dir``) and the value error (see ``evaluate_checkpoint``)."""
    torch.manual_seed(seed)  # the sampled actions: the same episodes whatever was evaluated before
    obs = np.stack([pad_observation(env.reset(seed=seed + i)[0], shape) for i, env in enumerate(envs)])
    videos = None
    if video_dir is not None:
        Path(video_dir).mkdir(parents=True, exist_ok=True)
        videos = EpisodeVideos(video_dir, envs[0])
    acting = Acting(agent, np.full(len(envs), task, dtype=np.int64), reward_scale)
    progress = Progress(envs[0].spec.id, episodes)
    games = Games(envs, shape, episodes, videos, progress)
    monte_carlo = MonteCarloValues(len(envs), config.discount, config.reward_clip == "abs_one",
                                   config.episodic_life and tasks_family(config.env) == "atari")
    sampled: list[np.ndarray] = []  # observations for the dead-unit count
    step = 0
    try:
        with torch.inference_mode():
            while len(games.returns) < episodes:
                if step % DEAD_UNIT_EVERY == 0 and sum(map(len, sampled)) < DEAD_UNIT_SAMPLE:
                    sampled.append(obs[games.active].copy())
                step += 1
                policy, values = acting.act(obs)
                action = (acting.agent.policy_head.mode(policy) if greedy else acting.agent.policy_head.sample(policy)).numpy()
                rewards, restarted, truncated_obs = games.step(obs, action, values.tolist(), monte_carlo)
                acting.advance(action, rewards, restarted)
                if truncated_obs:  # the values of their final observations, from the state that led there
                    for i, value in acting.truncation_values(obs, truncated_obs, action, rewards).items():
                        monte_carlo.end_episode(i, value)
                progress.update(len(games.returns), games.steps)
    finally:
        progress.close()
    for env in envs:
        env.close()
    value_error = (monte_carlo.summary() if not greedy and not config.normalize_rewards
                   else {"value_mse": None, "value_explained_variance": None})
    dead_units = agent.dead_unit_fractions(torch.from_numpy(np.concatenate(sampled))[:DEAD_UNIT_SAMPLE])
    return Played(games.returns[:episodes], games.cut, [str(path) for path in videos.written] if videos is not None else [],
                  value_error, dead_units)


class Games:
    """The episodes ``play`` plays on single envs: an env starts a new episode only while more are
    needed (so fast envs don't bias the mean), its first env's frames go to ``videos``, and an
    episode ``StepCap`` cut is counted and noted on ``progress``."""

    def __init__(self, envs: list, shape: tuple[int, ...], episodes: int, videos: EpisodeVideos | None,
                 progress: Progress):
        self.envs, self.shape, self.episodes, self.videos, self.progress = envs, shape, episodes, videos, progress
        self.started = len(envs)
        self.active = np.ones(len(envs), dtype=bool)
        self.returns: list[float] = []
        self.steps = 0  # env steps, over all envs
        self.cut = 0

    def step(self, obs: np.ndarray, action: np.ndarray, values: list[float], monte_carlo: MonteCarloValues):
        """Step the active envs with ``action``, writing their next observations into ``obs``;
        returns the rewards, which envs started a new episode and the final observations of the
        episodes a time limit cut (env -> observation; a terminated one ends in ``monte_carlo`` here)."""
        rewards = np.zeros(len(self.envs), dtype=np.float32)
        restarted = np.zeros(len(self.envs), dtype=bool)
        truncated_obs = {}
        for i, env in enumerate(self.envs):
            if not self.active[i]:
                continue
            observation, reward, terminated, truncated, info = env.step(action[i])
            self.steps += 1
            obs[i] = pad_observation(observation, self.shape)
            rewards[i] = float(reward)
            monte_carlo.step(i, values[i], float(reward), terminated, info)
            self._capture(i)
            if terminated or truncated:
                self.returns.append(float(info["episode"]["r"]))
                if info.get("cut"):
                    self.cut += 1
                    self.progress.note(f"an episode of {self.progress.label} reached {info['episode']['l']:,} steps "
                                       f"without ending: cut there, its return so far counted ({self.cut} cut so far; "
                                       "--max-episode-steps N sets the cap)")
                if terminated:
                    monte_carlo.end_episode(i, 0.0)
                else:
                    truncated_obs[i] = obs[i].copy()
                if self.videos is not None and i == 0:
                    self.videos.finish_episode()
                if self.started < self.episodes:
                    self.started += 1
                    obs[i] = pad_observation(env.reset()[0], self.shape)
                    restarted[i] = True
                    self._capture(i)
                else:
                    self.active[i] = False
        return rewards, restarted, truncated_obs

    def _capture(self, i: int) -> None:
        if self.videos is not None and i == 0:
            self.videos.capture()
