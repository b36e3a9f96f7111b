"""Everything a run is refused for before a process starts or a file is written: the settings
and their combinations, the envs, memory, the run directory (a live run's lock, leftover files,
the checkpoint of a ``--resume``) and ``--out`` paths. Each refusal is a ``UserError``: one line,
exit code 2 from the CLI.
"""

from __future__ import annotations

import dataclasses
import errno
import importlib.util
import os
import stat
import sys
from pathlib import Path

import yaml

from impactrl.config import TrainConfig, coerce, problems
from impactrl.errors import UserError
from impactrl.runlock import check_unlocked

# Settings a resumed run cannot change: they shape the model, its inputs or the algorithm's state.
FIXED_ON_RESUME = ("env", "algo", "torso", "hidden_sizes", "use_lstm", "lstm_size", "separate_value_network",
                   "normalize_observations", "normalize_rewards", "squash_actions", "optimizer", "frame_stack",
                   "popart", "image_layout")


def check_checkpoint_choice(resume: Path | None, checkpoint_name: str | None) -> None:
    """A checkpoint is named (``--checkpoint``) only to resume from it."""
    if checkpoint_name is not None and resume is None:
        raise UserError("--checkpoint picks the checkpoint of a --resume; add --resume RUN_DIR")


def validate_train(config: TrainConfig, resume: Path | None, checkpoint_name: str | None = None):
    """Check everything that can be checked without starting a process; return what was loaded."""
    import torch

    from impactrl.build import env_options, env_tasks, make_agent, rollout_spec, run_tasks
    from impactrl.data.rollout import data_bytes
    from impactrl.envs.factory import check_where_actors_run, env_family
    from impactrl.runtime import preflight as runtime_preflight

    found = problems(config) + env_options(config).problems()
    if found:
        raise UserError("; ".join(found))
    if config.wandb_project is not None and importlib.util.find_spec("wandb") is None:
        raise UserError('--wandb-project needs Weights & Biases: pip install -e ".[wandb]" (or pip install wandb)')
    if config.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: PyTorch sees no CUDA device here (use --device cpu, or install a CUDA build of torch)")
    if config.runtime == "local" and config.device == "cuda" and config.num_learners > torch.cuda.device_count():
        raise UserError(f"--num-learners {config.num_learners} with --device cuda needs one GPU per learner here; "
                        f"PyTorch sees {torch.cuda.device_count()} (or place them with --runtime ray)")
    tasks = run_tasks(config)
    check_where_actors_run(tasks.ids, env_options(config))
    family = env_family(tasks.ids[0])
    note_transposed_images(config, tasks, family)
    env_tasks(config, tasks)  # enough envs for the tasks, one weight per task
    if config.stop_at_return is not None and tasks.multi_task:
        raise UserError("--stop-at-return needs one task: a mean over several tasks' returns mixes their scales")
    check_memory(config, data_bytes(rollout_spec(config, make_agent(config, tasks), tasks)), family)
    checkpoint = check_run_dir(config, resume, checkpoint_name)
    runtime_preflight(config)  # last: it may join a Ray cluster
    return checkpoint


def note_transposed_images(config: TrainConfig, tasks, family: str) -> None:
    """With --image-layout auto, a note for each env whose 3-D observations are read as (height, width,
    channels) and transposed."""
    from impactrl.build import env_options
    from impactrl.envs.factory import image_layout, make_env

    if config.image_layout != "auto" or len(tasks.observation_space.shape) != 3 or family in ("atari", "minatar"):
        return
    for env_id in tasks.ids:
        raw = make_env(env_id, dataclasses.replace(env_options(config), image_layout="chw"))
        shape = tuple(raw.observation_space.shape)
        raw.close()
        if image_layout(env_id, raw.observation_space, "auto") == "hwc":
            print(f"impactrl train: note: {env_id}'s observations {shape} read as (height, width, channels) and "
                  f"transposed to {(shape[2], shape[0], shape[1])}; --image-layout chw says otherwise", file=sys.stderr)


def check_memory(config: TrainConfig, slot_bytes: int, family: str) -> None:
    """Refuse rollout data, or actor processes with it, beyond 80% of the available memory (saying how
    many actors fit); warn about many more actors than cores."""
    # Per learner, the slots plus its copies: the batch being gathered, one pending and IMPACT's buffer.
    batches_held = 2 + (config.buffer_batches if config.algo == "impact" else 0)

    def rollout_bytes(num_actors: int) -> int:  # the slot count (and PPO's batch) follow the actors
        sized = dataclasses.replace(config, num_actors=num_actors)
        return config.num_learners * slot_bytes * (sized.effective_rollout_slots + batches_held * sized.slots_per_batch)

    needed = rollout_bytes(config.num_actors)
    available = available_memory_bytes()
    if available is not None and needed > 0.8 * available:
        raise UserError(f"rollout data would need {needed / 2**30:.1f} GiB ({config.effective_rollout_slots} slots of "
                        f"{slot_bytes / 2**20:.1f} MiB plus {batches_held} batches in the learner), more than 80% of "
                        f"the {available / 2**30:.1f} GiB available: lower --unroll-length, --envs-per-actor, "
                        "--unrolls-per-batch or --rollout-slots")
    actors_here = config.runtime == "local" or config.ray_address is None  # processes on this machine
    if actors_here and available is not None:
        actor_bytes = ACTOR_MEMORY_MIB[family] * 2**20
        if needed + config.num_actors * actor_bytes > 0.8 * available:
            low, high = 0, config.num_actors  # the most actors that fit: low fits, high does not
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if rollout_bytes(middle) + middle * actor_bytes <= 0.8 * available \
                    else (low, middle)
            raise UserError(f"{config.num_actors} actor processes need about "
                            f"{gib(config.num_actors * actor_bytes)} ({ACTOR_MEMORY_MIB[family]} MiB each with "
                            f"{family} envs) besides {gib(needed)} of rollout data, more than 80% of the "
                            f"{gib(available)} available: at most {low} actors fit (--num-actors {low})")
    cores = os.cpu_count() or 1
    if actors_here and config.num_actors > ACTORS_PER_CORE * cores:
        # Not refused: such a run works, but each actor gets a sliver of a core and the policy lag grows.
        print(f"impactrl train: warning: {config.num_actors} actor processes on {cores} cores; beyond about one per "
              "core they only take turns (raise --envs-per-actor instead)", file=sys.stderr)


def check_run_dir(config: TrainConfig, resume: Path | None, checkpoint_name: str | None):
    """RUN_DIR free of a live run; with --resume, its checkpoint (returned), whose model-shaping settings
    the config keeps; otherwise empty or absent."""
    from impactrl.checkpoint import load_checkpoint

    run_dir = config.run_dir()
    check_out(run_dir, directory=True)
    check_unlocked(run_dir)  # a live run's own message, before "already holds files" or its checkpoint
    if resume is None:
        if run_dir.exists() and any(run_dir.iterdir()):
            raise UserError(f"--out {run_dir} already holds files; continue it with --resume {run_dir} or pick a new --out")
        return None
    checkpoint = load_checkpoint(run_dir, checkpoint_name)
    saved = coerce(yaml.safe_load(checkpoint["config"]), "the checkpoint's config")
    changed = [f"--{name.replace('_', '-')} {getattr(config, name)!r} (the run has {saved[name]!r})"
               for name in FIXED_ON_RESUME
               if name in saved and _comparable(getattr(config, name)) != _comparable(saved[name])]
    if changed:
        raise UserError(f"--resume {run_dir}: {'; '.join(changed)}: these settings shape the model and cannot "
                        "change in a resumed run; start a new run with --out instead")
    return checkpoint


def check_out(out: Path, directory: bool) -> None:
    """Refuse an ``--out`` that cannot be made: a name longer than the filesystem allows, a parent
    that is a file, or an existing path of the other kind (a file for a run directory, a directory
    for a picture). A missing one passes: whether it can be written is found when it is made."""
    if name_too_long(out):
        raise UserError(f"--out {out} is not writable: {os.strerror(errno.ENAMETOOLONG)}")
    try:
        is_directory = stat.S_ISDIR(out.stat().st_mode)
    except FileNotFoundError:
        return
    except OSError as error:
        raise UserError(f"--out {out} is not writable: {error.strerror or error}") from None
    if directory and not is_directory:
        raise UserError(f"--out {out} is a file, not a directory: name a new run directory")
    if is_directory and not directory:
        raise UserError(f"--out {out} is a directory: name the picture to write (e.g. {out / 'curves.png'})")


def name_too_long(path: Path) -> bool:
    """Whether a name in ``path`` is longer than the filesystem of its nearest existing folder allows
    (``stat`` says so only where the names before it exist)."""
    existing = next(folder for folder in path.absolute().parents if os.path.isdir(folder))
    return any(len(os.fsencode(name)) > os.pathconf(existing, "PC_NAME_MAX") for name in path.parts)


# What one actor process costs: its PSS (private memory plus its share of the shared libraries:
# Python, torch, the env and the model), measured on Linux with the family's preset envs per actor
# (CartPole 161 MiB, Pong 200, MinAtar Breakout with 32 envs 262, Hopper about 190).
ACTOR_MEMORY_MIB = {"classic": 160, "mujoco": 190, "atari": 200, "minatar": 260}
ACTORS_PER_CORE = 4  # more actor processes than this per core draw a warning


def gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**29 else f"{size / 2**20:.0f} MiB"


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _comparable(value):
    return list(value) if isinstance(value, (tuple, list)) else value
