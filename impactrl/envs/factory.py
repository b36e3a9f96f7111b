"""Build Gymnasium environments with the preprocessing each family needs.

Families (see :func:`env_family`):

- ``"atari"``   — ALE ids (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, … any id whose env is an
  ``ale_py`` ``AtariEnv``): DeepMind preprocessing, uint8 ``(frame_stack, 84, 84)`` observations.
- ``"minatar"`` — ``MinAtar/*`` ids: uint8 ``(C, 10, 10)`` observations.
- ``"classic"`` — any other registered Gymnasium id (CartPole, MuJoCo, ``impactrl/*`` …), as is.

Registration of the ALE, MinAtar and impactrl ids happens lazily, once, in :func:`register_all`.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import numbers
import threading
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import (AtariPreprocessing, FrameStackObservation, NormalizeReward, RecordEpisodeStatistics,
                                TransformReward)

from impactrl.errors import UserError
from impactrl.envs.wrappers import ChannelsFirst, ChannelsFirstUint8, ClipToBounds, EpisodicLife, PressFire, waits_for_fire

__all__ = [
    "EnvOptions",
    "EnvFamily",
    "CARTPOLE_NO_VELOCITY_ID",
    "register_all",
    "env_family",
    "check_env_id",
    "make_env",
]

EnvFamily = Literal["atari", "minatar", "mujoco", "classic"]
CARTPOLE_NO_VELOCITY_ID = "impactrl/CartPoleNoVelocity-v1"


@dataclass(frozen=True)
class EnvOptions:
    """How :func:`make_env` builds an environment. Atari-only fields are ignored elsewhere."""

    frame_skip: int = 4  # Atari only: action repeat with max-pool over the last two frames
    frame_stack: int = 4  # Atari only
    noop_max: int = 30  # Atari only: random no-ops at reset
    screen_size: int = 84  # Atari only
    sticky_action_prob: float | None = None  # Atari only: None = the id's default (0.25 for v5)
    episodic_life: bool = True  # Atari only, training only: a life loss ends the training episode
    fire_reset: bool = True  # Atari only: FIRE pressed after each reset and lost life in games that wait for it
    max_episode_steps: int | None = None  # None = the env's registered limit
    normalize_reward_gamma: float | None = None  # training only: scale rewards by the std of the γ-discounted return
    render_mode: str | None = None  # "rgb_array": env.render() returns frames (impactrl eval --video)
    image_layout: str = "auto"  # other families' 3-D observations: "chw", "hwc" (transposed) or "auto"

    def problems(self) -> list[str]:
        """Every out-of-range option, each as a short phrase; empty when all are valid."""
        out: list[str] = []
        for name, minimum in (("frame_skip", 1), ("frame_stack", 1), ("noop_max", 0), ("screen_size", 8)):
            problem = _int_problem(name, getattr(self, name), minimum)
            if problem:
                out.append(problem)
        if self.max_episode_steps is not None:
            problem = _int_problem("max_episode_steps", self.max_episode_steps, 1)
            if problem:
                out.append(problem + " (or None for the registered limit)")
        p = self.sticky_action_prob
        if p is not None:
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                out.append(f"sticky_action_prob must be a number in [0, 1] or None, got {p!r}")
            elif not (0.0 <= float(p) <= 1.0):  # also rejects NaN
                out.append(f"sticky_action_prob must be in [0, 1], got {p!r}")
        g = self.normalize_reward_gamma
        if g is not None and not (isinstance(g, numbers.Real) and 0.0 < float(g) <= 1.0):
            out.append(f"normalize_reward_gamma must be in (0, 1] or None, got {g!r}")
        for name in ("episodic_life", "fire_reset"):
            if not isinstance(getattr(self, name), bool):
                out.append(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.image_layout not in ("auto", "chw", "hwc"):
            out.append(f"image_layout must be auto, chw or hwc, got {self.image_layout!r}")
        return out


def _int_problem(name: str, value: object, minimum: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return f"{name} must be an integer ≥ {minimum}, got {value!r}"
    if value < minimum:
        return f"{name} must be ≥ {minimum}, got {value}"
    return None


# --------------------------------------------------------------------------- registration

_registered = False
_register_lock = threading.Lock()
# The ids minatar.gym.register_envs() registers, by name: importing minatar imports matplotlib and
# seaborn, seconds of every process's start, so only gym.make of a MinAtar id imports it.
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def register_all() -> None:
    """Register the ALE, MinAtar and ``impactrl/*`` ids with Gymnasium. Idempotent, thread-safe."""
    global _registered
    if _registered:
        return
    with _register_lock:
        if _registered:
            return
        before = set(gym.registry)
        import ale_py

        gym.register_envs(ale_py)

        for game in MINATAR_GAMES:
            name = game.title().replace("_", "")
            for version, minimal_action_set in (("v0", False), ("v1", True)):
                if f"MinAtar/{name}-{version}" not in gym.registry:
                    gym.register(id=f"MinAtar/{name}-{version}", entry_point="minatar.gym:BaseEnv",
                                 kwargs={"game": game, "use_minimal_action_set": minimal_action_set})

        if CARTPOLE_NO_VELOCITY_ID not in gym.registry:
            cartpole = gym.spec("CartPole-v1")
            gym.register(
                id=CARTPOLE_NO_VELOCITY_ID,
                entry_point="impactrl.envs.wrappers:make_cartpole_no_velocity",
                max_episode_steps=cartpole.max_episode_steps,
                reward_threshold=cartpole.reward_threshold,
            )
        _fresh_ids.update(set(gym.registry) - before)
        _registered = True


# --------------------------------------------------------------------------- where actors run

# The ids registered when this module is first imported (Gymnasium's own and its plugins'), before a
# script's `if __name__ == "__main__":` block can register more (impactrl imports it on import),
# and those register_all adds.
_fresh_ids = set(gym.registry)
# Modules whose ids every process registers on import (register_all's among them).
FRESH_ENTRY_POINTS = ("gymnasium.envs.", "ale_py", "minatar", "impactrl.")
PROBE_TIMEOUT_S = 120.0


def registered_on_import(env_id: str) -> bool:
    """Whether every fresh process (an actor: spawned, or a Ray worker) registers ``env_id`` too."""
    if ":" in env_id:  # the actor imports the module itself, unless it is a script's __main__
        return env_id.partition(":")[0] not in ("__main__", "__mp_main__")
    spec = env_spec(env_id)
    from_fresh_module = isinstance(spec.entry_point, str) and spec.entry_point.startswith(FRESH_ENTRY_POINTS)
    return from_fresh_module and env_id in _fresh_ids


def check_where_actors_run(env_ids: tuple[str, ...], options: EnvOptions) -> None:
    """Make each env a fresh process may lack in one spawned process, as actors are made; UserError
    when it cannot (an id registered only under a script's `if __name__ == "__main__":`)."""
    import multiprocessing

    unsure = [env_id for env_id in env_ids if not registered_on_import(env_id)]
    if not unsure:
        return  # the common case: no process to start
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    probe = ctx.Process(target=_probe, args=(unsure, options, writer), name="impactrl-env-probe", daemon=True)
    probe.start()
    writer.close()
    try:
        failure = reader.recv() if reader.poll(PROBE_TIMEOUT_S) else f"no answer in {PROBE_TIMEOUT_S:g} s"
    except EOFError:
        failure = None
    probe.join(timeout=5.0)
    if probe.is_alive():
        probe.kill()
        probe.join()
    if failure is None and probe.exitcode != 0:
        failure = f"the process exited with code {probe.exitcode}"
    if failure:
        raise UserError(f"{failure}; the actors run in fresh processes, where an id registered only in this one "
                        "(e.g. under `if __name__ == \"__main__\":`) does not exist: register it at import time in a "
                        "module, or pass --env module:EnvId")


def _probe(env_ids: list[str], options: EnvOptions, answer) -> None:
    """In a spawned process: make and reset each env; send None, or what failed."""
    register_all()
    for env_id in env_ids:
        if env_id.partition(":")[2] not in gym.registry and env_id not in gym.registry:
            answer.send(f"--env {env_id} is not registered in a fresh process")
            return
        try:
            env = make_env(env_id, options)
            env.reset(seed=0)
            env.close()
        except Exception as error:  # noqa: BLE001 - whatever stops an actor
            answer.send(f"--env {env_id} cannot be made in a fresh process ({_one_line(error)})")
            return
    answer.send(None)


# --------------------------------------------------------------------------- ids


def check_env_id(env_id: str) -> None:
    """Raise :class:`UserError` (one line, with a suggestion when one is close) unless ``env_id``
    names a registered environment."""
    if not isinstance(env_id, str) or not env_id.strip():
        raise UserError(
            f"malformed environment id {env_id!r}; expected a Gymnasium id such as 'CartPole-v1'"
        )
    register_all()
    if env_id in gym.registry:
        return
    if ":" in env_id:  # "module:EnvName-v0": gym.make imports the module, which registers ids
        module, _, name = env_id.partition(":")
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - anything here means "cannot find it"
            raise UserError(
                f"environment id {env_id!r}: cannot import module {module!r} ({_one_line(exc)})"
            ) from None
        if name in gym.registry:
            return
        raise UserError(f"unknown environment id {env_id!r}: module {module!r} registers no id {name!r}")

    from gymnasium.envs.registration import parse_env_id

    try:
        parse_env_id(env_id)
        what = "unknown environment id"
    except Exception:  # noqa: BLE001 - gymnasium raises error.Error for a malformed id
        what = "unknown (malformed) environment id"
    suggestion = _closest_id(env_id.strip().lower())
    if suggestion:
        raise UserError(f"{what} {env_id!r}; did you mean {suggestion!r}?")
    raise UserError(
        f"{what} {env_id!r}; no registered id is close "
        "(known: Gymnasium ids, ALE/<Game>-v5, MinAtar/<Game>-v1, impactrl/CartPoleNoVelocity-v1)"
    )


CLOSE_ID_RATIO = 0.7  # difflib's similarity from which an id (or a game's name) counts as close


def _closest_id(wanted: str) -> str | None:
    """The registered id closest to ``wanted`` (lower case), also matched by its name without the
    namespace: "pong-v5" means ALE/Pong-v5, and "breakout-v1" MinAtar/Breakout-v1. A match that
    keeps the namespace but changes the game ("minatar/pong-v1" to MinAtar/Breakout-v1) loses to
    the same game in another namespace (ALE/Pong-v5), or in none ("minatar/hopper-v5")."""
    by_lower: dict[str, str] = {}
    for key in gym.registry:
        by_lower.setdefault(key.lower(), key)
    for key in gym.registry:
        by_lower.setdefault(_bare_name(key.lower()), key)
    by_lower.pop("", None)
    candidates = list(by_lower)

    def closest(query: str) -> str | None:
        close = difflib.get_close_matches(query, candidates, n=1, cutoff=CLOSE_ID_RATIO)
        return close[0] if close else None

    match = closest(wanted)
    bare = _bare_name(wanted)
    if bare != wanted and (match is None or difflib.SequenceMatcher(None, bare, _bare_name(match)).ratio() < CLOSE_ID_RATIO):
        match = closest(bare) or match
    return by_lower[match] if match else None


def _bare_name(env_id: str) -> str:
    """An id without its namespace: "ALE/Pong-v5" -> "Pong-v5"."""
    return env_id.rpartition("/")[2]


def env_family(env_id: str) -> EnvFamily:
    """``"atari"`` for ids whose env is an ale_py ``AtariEnv``, ``"minatar"`` for ``MinAtar/*``,
    ``"classic"`` for any other registered Gymnasium id. Unknown ids raise :class:`UserError`."""
    spec = env_spec(env_id)
    entry_point = spec.entry_point
    if spec.namespace == "MinAtar" or (isinstance(entry_point, str) and entry_point.startswith("minatar")):
        return "minatar"
    if _is_atari_entry_point(entry_point):
        return "atari"
    if isinstance(entry_point, str) and entry_point.startswith("gymnasium.envs.mujoco"):
        return "mujoco"
    return "classic"


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The spec of an id, also in the ``module:EnvName-v0`` form; unknown ids raise :class:`UserError`.
    Checking registers the ids first, so this works in a process that never made an env."""
    check_env_id(env_id)
    return gym.spec(env_id.partition(":")[2] if ":" in env_id else env_id)


def _is_atari_entry_point(entry_point: object) -> bool:
    from ale_py.env import AtariEnv

    if isinstance(entry_point, str):
        if entry_point == "ale_py.env:AtariEnv":
            return True
        if not entry_point.startswith("ale_py"):
            return False
        from gymnasium.envs.registration import load_env_creator

        try:
            entry_point = load_env_creator(entry_point)
        except Exception:  # noqa: BLE001
            return False
    return isinstance(entry_point, type) and issubclass(entry_point, AtariEnv)


# --------------------------------------------------------------------------- make_env


def make_env(
    env_id: str,
    options: EnvOptions = EnvOptions(),
    *,
    seed: int | None = None,
    training: bool = True,
) -> gym.Env:
    """Build one environment for ``env_id`` with its family's preprocessing.

    Episode statistics contract: every env is wrapped, innermost (right after ``gym.make``), in
    ``gymnasium.wrappers.RecordEpisodeStatistics``. ``info["episode"]`` (``{"r": return,
    "l": length, "t": seconds}``) therefore appears in a step's info exactly when a REAL episode
    (a whole game) ends — terminated or truncated — and never otherwise. The actor reads episode
    returns from ``info["episode"]``, never by summing the rewards it sees: under Atari episodic
    life a life loss gives ``terminated=True`` without an ``"episode"`` key, and at game over
    ``info["episode"]["r"]`` is the full-game (unclipped) score. For Atari, ``"l"`` counts
    emulator frames (including the reset no-ops), not agent steps.

    Wrappers, innermost first:

    - atari: ``gym.make(env_id, frameskip=1, full_action_space=False[, repeat_action_probability])``
      → RecordEpisodeStatistics → AtariPreprocessing(noop_max, frame_skip, screen_size, grayscale,
      uint8) → FrameStackObservation(frame_stack) → PressFire (only if ``options.fire_reset`` and
      the game's action 1 is FIRE) → EpisodicLife (only if ``training`` and
      ``options.episodic_life``). Observation: uint8 ``(frame_stack, screen_size, screen_size)``.
    - minatar: ``gym.make`` → RecordEpisodeStatistics → ChannelsFirstUint8. Observation: uint8
      ``(C, 10, 10)`` in {0, 1}.
    - classic, mujoco: ``gym.make`` → RecordEpisodeStatistics.
    - any family with a Box action space: → ClipToBounds (a Gaussian policy samples outside the
      bounds; the log-prob stays that of the unclipped sample, as in CleanRL; the action space keeps
      the env's bounds).
    - ``training`` and ``options.normalize_reward_gamma``: → NormalizeReward(γ) → rewards clipped
      to ±10 (CleanRL's MuJoCo setup). Episode statistics stay unscaled: they are recorded inside.

    ``options.max_episode_steps`` (None = the registered limit) counts agent steps. For
    classic/MinAtar it goes to ``gym.make`` (a TimeLimit); for Atari it becomes the ALE's
    ``max_num_frames_per_episode = max_episode_steps * frame_skip`` (an emulator-frame limit that
    also counts the reset no-ops; the v5 default is 108,000 frames).

    Seeding: ``make_env`` does not reset the env. With ``seed`` it only seeds the action space
    (``env.action_space.seed(seed)``); the caller must call ``env.reset(seed=seed)`` the first
    time to seed the environment itself.

    Raises :class:`UserError` (one line) for an unknown id, invalid options, or when the
    environment cannot be created (e.g. a missing optional dependency such as MuJoCo).
    """
    check_env_id(env_id)
    _check_options(options)
    env = _make_family_env(env_id, options, training=training)
    env = _wrap_actions_and_rewards(env, options, training=training)
    if seed is not None:
        env.action_space.seed(seed)
    return env


def _check_options(options: EnvOptions) -> None:
    if not isinstance(options, EnvOptions):
        raise UserError(f"options must be an EnvOptions, got {type(options).__name__}")
    problems = options.problems()
    if problems:
        raise UserError("; ".join(problems))


def _make_family_env(env_id: str, options: EnvOptions, *, training: bool) -> gym.Env:
    """The env with its family's preprocessing (see ``make_env``), episode statistics innermost."""
    family = env_family(env_id)
    if family == "atari":
        return _make_atari(env_id, options, training=training)
    if family == "minatar":
        _import_minatar_quietly()
    env = _gym_make(env_id, max_episode_steps=options.max_episode_steps, render_mode=options.render_mode)
    env = RecordEpisodeStatistics(env)
    if family == "minatar":
        return ChannelsFirstUint8(env)
    if image_layout(env_id, env.observation_space, options.image_layout) == "hwc":
        env = ChannelsFirst(env)
    return env


def _wrap_actions_and_rewards(env: gym.Env, options: EnvOptions, *, training: bool) -> gym.Env:
    """Box actions clipped to the bounds; in training with ``normalize_reward_gamma``, rewards
    normalised and clipped to ±10."""
    if isinstance(env.action_space, gym.spaces.Box):
        env = ClipToBounds(env)
    if training and options.normalize_reward_gamma is not None:
        env = NormalizeReward(env, gamma=float(options.normalize_reward_gamma))
        env = TransformReward(env, lambda reward: float(np.clip(reward, -10.0, 10.0)))
    return env


def channels_last(shape: tuple[int, ...]) -> bool | None:
    """True for an (H, W, C) image shape, False for (C, H, W), None when the shape says neither: a
    channel count is <= 4 or at most half the other sizes."""
    def channels(size: int, others: tuple[int, ...]) -> bool:
        return size <= 4 or 2 * size <= min(others)

    first, last = channels(shape[0], shape[1:]), channels(shape[-1], shape[:-1])
    return None if first == last else last


def image_layout(env_id: str, space: gym.Space, layout: str) -> str | None:
    """The layout of a 3-D Box observation ("chw" or "hwc"; None for others): ``layout`` if set,
    else read from the shape; UserError when the shape says neither."""
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3):
        return None
    if layout != "auto":
        return layout
    last = channels_last(tuple(space.shape))
    if last is None:
        raise UserError(f"{env_id}'s observations {tuple(space.shape)} may be channels first or last: pass "
                        "--image-layout chw (channels, height, width) or hwc (height, width, channels)")
    return "hwc" if last else "chw"


def _import_minatar_quietly() -> None:
    # minatar logs "Cannot import seaborn" at import time where seaborn is missing; seaborn only
    # matters for its own rendering, so keep that warning out of every run's output.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        import minatar.gym  # noqa: F401
    finally:
        logging.disable(previous)


def _make_atari(env_id: str, options: EnvOptions, *, training: bool) -> gym.Env:
    kwargs: dict[str, object] = {"frameskip": 1, "full_action_space": False}
    if options.sticky_action_prob is not None:
        kwargs["repeat_action_probability"] = float(options.sticky_action_prob)
    if options.max_episode_steps is not None:
        kwargs["max_num_frames_per_episode"] = int(options.max_episode_steps) * int(options.frame_skip)
    env = _gym_make(env_id, render_mode=options.render_mode, **kwargs)
    env = RecordEpisodeStatistics(env)
    env = AtariPreprocessing(
        env,
        noop_max=int(options.noop_max),
        frame_skip=int(options.frame_skip),
        screen_size=int(options.screen_size),
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    env = FrameStackObservation(env, int(options.frame_stack))
    if options.fire_reset and waits_for_fire(env):
        env = PressFire(env)
    if training and options.episodic_life:
        env = EpisodicLife(env)
    return env


def _gym_make(env_id: str, render_mode: str | None = None, **kwargs: object) -> gym.Env:
    """``gym.make`` with its failures for a known id turned into a one-line :class:`UserError`."""
    if render_mode is not None:  # only then: gym.make hands it to constructors that may not take it
        kwargs["render_mode"] = render_mode
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise UserError(_missing_dependency_message(env_id, exc)) from exc
    except ImportError as exc:
        raise UserError(
            f"environment {env_id!r} needs a package that is not installed: {_one_line(exc)}"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - any other creation failure, cause kept as __cause__
        raise UserError(
            f"could not create environment {env_id!r}: {type(exc).__name__}: {_one_line(exc)}"
        ) from exc


def _missing_dependency_message(env_id: str, exc: BaseException) -> str:
    text = _one_line(exc)
    spec = env_spec(env_id)
    where = f"{spec.entry_point} {text}".lower()
    if "mujoco" in where:
        return f"environment {env_id!r} needs MuJoCo: pip install 'gymnasium[mujoco]'"
    if "box2d" in where:
        return f"environment {env_id!r} needs Box2D: pip install swig 'gymnasium[box2d]'"
    return f"environment {env_id!r} needs a package that is not installed: {text}"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."

