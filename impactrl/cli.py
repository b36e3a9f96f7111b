"""``impactrl train`` and ``impactrl eval``.

Every mistake a user can make is found here, before any process starts or any file is
written, and reported as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import importlib.util
import io
import os
import re
import shutil
import signal
import stat
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

import tyro
import yaml

from impactrl.config import (TrainConfig, coerce, envs_split_for_learners, integer_settings, load_yaml, preset_values,
                             problems, renamed_flags, to_yaml, unread_settings)
from impactrl.config.renamed import old_flags_help
from impactrl.errors import ActorFailed, LearnerFailed, RunDirFailed, TrainingDiverged, UserError, run_dir_failed, stopped
from impactrl.runlock import check_unlocked, hold

USAGE = """usage: impactrl {train,eval,plot,bench,diagnose} ...

  impactrl train --algo impala --env CartPole-v1 --out runs/cartpole   train (see impactrl train --help)
  impactrl train --resume RUN_DIR [--checkpoint NAME]                  continue a stopped run
  impactrl eval RUN_DIR_OR_CHECKPOINT --episodes 20                    evaluate, print one JSON line
  impactrl plot RUN_DIR [RUN_DIR ...] --out curves.png                 learning curves
  impactrl bench --env ALE/Pong-v5 --seconds 60                        throughput and where the time goes
  impactrl diagnose RUN_DIR                                            what went wrong and what to change
"""


# Settings a resumed run cannot change: they shape the model, its inputs or the algorithm's state.
FIXED_ON_RESUME = ("env", "algo", "torso", "hidden_sizes", "use_lstm", "lstm_size", "separate_value_network",
                   "normalize_observations", "normalize_rewards", "squash_actions", "optimizer", "frame_stack",
                   "popart", "image_layout")


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one line and exit code 2 like every other mistake,
    not argparse's usage block."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


def parse_train_flags(base: TrainConfig, args: list[str]) -> TrainConfig:
    """tyro's parse of the train flags; its error box (nine lines for a bad number) becomes its
    first paragraph, in one line."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            config = tyro.cli(TrainConfig, default=base, args=whole_numbers(args), prog="impactrl train")
    except SystemExit as exit_:
        if exit_.code in (0, None):  # --help
            raise
        raise UserError(f"{box_message(captured.getvalue())} (see impactrl train --help)") from None
    sys.stderr.write(captured.getvalue())  # tyro's warnings, if any
    return config


def whole_numbers(args: list[str]) -> list[str]:
    """The flags with each integer setting's integer-valued number (``--total-env-steps 1e6``) written as
    an integer; a fraction (``1.5``) is refused. Words that are no number are left to the parser."""
    integers = integer_settings()
    out = list(args)
    for i, arg in enumerate(args):
        flag, equals, value = arg.partition("=")
        at = i if equals else i + 1
        if not arg.startswith("--") or flag[2:].replace("-", "_") not in integers or at == len(args):
            continue
        value = value if equals else args[at]
        if re.fullmatch(r"[-+]?[0-9_]+", value.strip()):
            continue  # an integer already
        try:
            number = float(value)
        except ValueError:
            continue
        if not number.is_integer():
            raise UserError(f"{flag} must be an integer, got {value} (see impactrl train --help)")
        out[at] = f"{flag}={int(number)}" if equals else str(int(number))
    return out


def box_message(text: str) -> str:
    """The first paragraph of a tyro error box (the lines before its first rule), joined."""
    lines = [line.strip().strip("│╭╮╰╯").strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines()]
    paragraph = []
    for line in lines[1:]:  # lines[0] is the box's title
        if set(line) <= set("─"):  # a rule, or an empty line
            if paragraph:
                break
            continue
        paragraph.append(line)
    message = " ".join(paragraph) or " ".join(line for line in lines if line) or "cannot parse the flags"
    return message.removeprefix("Error parsing ")


class TrainRequest(NamedTuple):
    config: TrainConfig
    resume: Path | None  # the run directory to continue
    checkpoint: str | None  # the checkpoint named with --checkpoint
    quiet: bool  # --quiet: nothing on the terminal (train.log still gets it all)


def resolve_train_config(argv: Sequence[str], settings: dict | None = None, source: str = "config") -> TrainRequest:
    """Defaults < the presets (or the resumed run's config) < --config FILE.yaml < ``settings`` (the
    Python API's, checked like the file's; ``source`` names them in errors) < flags."""
    pre = ArgumentParser(prog="impactrl train", add_help=False)
    pre.add_argument("--config", type=Path)
    pre.add_argument("--resume", type=Path)
    pre.add_argument("--checkpoint")
    pre.add_argument("--quiet", action="store_true")
    pre.add_argument("--env")
    pre.add_argument("--algo")
    known, rest = pre.parse_known_args(list(argv))
    rest = renamed_flags(rest)
    help_only = "-h" in rest or "--help" in rest
    if known.checkpoint is not None and known.resume is None:
        raise UserError("--checkpoint picks the checkpoint of a --resume; add --resume RUN_DIR")
    if known.algo is not None:
        rest += ["--algo", known.algo]
    file_values = load_yaml(known.config) if known.config is not None else {}
    file_values.update(coerce(settings or {}, source, warn_renamed=True))
    if known.resume is not None:
        saved = known.resume / "config.yaml"
        if not os.path.isfile(saved):  # False too for a name too long to exist
            raise UserError(f"--resume {known.resume}: no config.yaml there, so it is not an impactrl run directory")
        values = load_yaml(saved)
        values["out"] = known.resume
    elif help_only:
        values = {}  # --help shows the plain defaults, without loading env registries for a preset
    else:
        from impactrl.envs.tasks import tasks_family

        env = known.env or file_values.get("env") or TrainConfig.env
        algo = known.algo or file_values.get("algo") or TrainConfig.algo
        values = preset_values(algo, tasks_family(env), env)
    values.update(file_values)
    if known.env is not None:
        values["env"] = known.env
    base = dataclasses.replace(TrainConfig(), **coerce(values, "config"))
    if help_only:
        print("  --config FILE.yaml    settings to start from (flags override them)\n"
              "  --resume RUN_DIR      continue the run in RUN_DIR from its newest readable checkpoint\n"
              "  --checkpoint NAME     with --resume: continue from this one instead (e.g. ckpt_0000001200)\n"
              "  --quiet               nothing on the terminal (RUN_DIR/train.log still gets every line)\n"
              f"{old_flags_help()}"
              "Defaults below are before presets: the env family's and the algorithm's (impactrl/configs/)\n"
              "apply on top of them.\n")
    config = parse_train_flags(base, rest)
    from impactrl.envs.tasks import tasks_family

    given = set(file_values) | {flag_name(arg) for arg in rest if arg.startswith("--")}
    if known.resume is None:
        config, note = envs_split_for_learners(config, given)
        if note is not None:
            print(f"impactrl train: note: {note}", file=sys.stderr)
    for problem in unread_settings(config, given, tasks_family(config.env)):
        print(f"impactrl train: warning: {problem}; ignored", file=sys.stderr)
    return TrainRequest(config, known.resume, known.checkpoint, known.quiet)


def flag_name(arg: str) -> str:
    """``--no-use-lstm`` and ``--learning-rate=0.1`` -> the setting names ``use_lstm``, ``learning_rate``."""
    name = arg[2:].split("=", 1)[0].replace("-", "_")
    return name[3:] if name.startswith("no_") else name


def validate_train(config: TrainConfig, resume: Path | None, checkpoint_name: str | None = None):
    """Check everything that can be checked without starting a process; return what was loaded."""
    import torch

    from impactrl.build import env_options, env_tasks, make_agent, rollout_spec, run_tasks
    from impactrl.data.rollout import data_bytes
    from impactrl.envs.factory import check_where_actors_run, env_family
    from impactrl.runtime import preflight

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
    preflight(config)  # last: it may join a Ray cluster
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


def create_run_dir(run_dir: Path) -> None:
    """Create RUN_DIR (and missing parents); on failure remove what was made and explain."""
    missing = []
    parent = run_dir
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        for made in missing:
            shutil.rmtree(made, ignore_errors=True)
        raise UserError(f"--out {run_dir} is not writable: {error.strerror or error}") from None


def write_config(run_dir: Path, config: TrainConfig) -> None:
    """``RUN_DIR/config.yaml``, replaced atomically: a crash never leaves half a file."""
    partial = run_dir / ".config.yaml.partial"
    partial.write_text(to_yaml(config))
    partial.replace(run_dir / "config.yaml")


def train(argv: Sequence[str]) -> int:
    run_dir, counters = run_train(resolve_train_config(argv), ["train", *argv])
    print(f"done: {counters.env_steps:,} env steps, {counters.updates:,} learner updates, "
          f"{counters.wall_time_s:.1f}s; run in {run_dir}")
    return 0


def run_train(request: TrainRequest, invocation: list[str]):
    """Check, then train ``request`` in its run directory (``impactrl train`` and impactrl.train);
    (run directory, final counters). ``invocation`` goes to invocations.jsonl."""
    config, resume, checkpoint_name, quiet = request
    checkpoint = validate_train(config, resume, checkpoint_name)
    from impactrl.provenance import record_invocation
    from impactrl.training import build_learner, process_settings_kept, train as run_training

    with process_settings_kept():
        # Nothing is written before the learner is built and the checkpoint loaded into it: a
        # command that fails leaves the run directory as it found it.
        learner, spec = build_learner(config, checkpoint)
        run_dir = config.run_dir()
        create_run_dir(run_dir)
        with hold(run_dir):  # for the run's life: a second train on RUN_DIR is refused
            try:
                write_config(run_dir, config)
                record_invocation(run_dir, invocation, checkpoint)
            except OSError as error:  # a full disk: the probe file of create_run_dir took no space
                raise UserError(f"--out {run_dir}: cannot write {error.filename or run_dir}: "
                                f"{error.strerror or error}") from None
            counters = run_training(config, learner, spec, run_dir, quiet)
    return run_dir, counters


def bench(argv: Sequence[str]) -> int:
    pre = ArgumentParser(prog="impactrl bench", add_help=False)
    pre.add_argument("--seconds", type=float, default=60.0)
    pre.add_argument("--warmup-seconds", type=float, default=15.0)
    pre.add_argument("--synthetic-actors", type=int)
    pre.add_argument("--actors-per-process", type=int)
    pre.add_argument("--no-learning", action="store_true")
    pre.add_argument("--json", action="store_true")
    known, rest = pre.parse_known_args(list(argv))
    if "-h" in rest or "--help" in rest:
        print("impactrl bench [TRAIN FLAGS] [--seconds 60] [--warmup-seconds 15] [--synthetic-actors N\n"
              "               [--actors-per-process K]] [--no-learning] [--json]\n\n"
              "Train for --seconds in a scratch directory and report env steps/s after the warm-up, with\n"
              "the actors' time split (env, inference, wait) and the learner's (receive, assemble, transfer,\n"
              "train, publish). Takes every flag of impactrl train (see impactrl train --help).\n\n"
              "  --synthetic-actors N    N simulated actors replay unrolls recorded from --env (no env step,\n"
              "                          no inference) as fast as the learner takes them: its intake alone\n"
              "  --actors-per-process K  simulated actors per process (default: N spread over the cores\n"
              "                          the learner leaves)\n"
              "  --no-learning           the learner receives, assembles, transfers and publishes, but takes\n"
              "                          no SGD step and leaves the observation statistics as they are\n"
              "  --json                  print only one JSON object")
        return 0
    if not known.seconds > known.warmup_seconds >= 0:
        raise UserError(f"--seconds ({known.seconds}) must exceed --warmup-seconds ({known.warmup_seconds})")
    synthetic = synthetic_actors(known)
    if synthetic is not None:
        rest += ["--num-actors", str(known.synthetic_actors)]
    from impactrl.bench import format_summary, learner_rss_mb, scratch_dir, summarize
    from impactrl.data.rollout import data_bytes
    from impactrl.metrics import json_line
    from impactrl.training import build_learner, train as run_training

    run_dir = scratch_dir()
    config = resolve_train_config([*rest, "--out", str(run_dir), "--total-env-steps", str(10**12),
                                   "--max-wall-time-s", str(known.seconds), "--log-interval-s", "2",
                                   "--checkpoint-interval-s", str(10**9)]).config
    validate_train(config, None)
    learner, spec = build_learner(config, None)
    learner.learn = not known.no_learning
    try:
        create_run_dir(run_dir)
        write_config(run_dir, config)
        run_training(config, learner, spec, run_dir, quiet=True, synthetic=synthetic)
        summary = summarize(run_dir / "metrics.jsonl", known.warmup_seconds)
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)
    step_bytes = data_bytes(spec) / (config.unroll_length * config.envs_per_actor)
    result = {"env": config.env, "algo": config.algo, "runtime": config.runtime, "actors": config.num_actors,
              "synthetic": synthetic is not None, "learning": learner.learn,
              "actors_per_process": 1 if synthetic is None else synthetic.actors_per_process,
              "envs_per_actor": config.envs_per_actor, "frame_dedup": spec.frame_stack > 1, **summary,
              "bytes_per_s": summary["env_steps_per_s"] * step_bytes, "learner_rss_mb": learner_rss_mb()}
    if not known.json:
        print(format_summary(summary, config.env, config.algo))
    print(json_line(result))
    return 0


def synthetic_actors(known: argparse.Namespace):
    """The simulated actors ``impactrl bench`` asked for, checked; None for real ones."""
    if known.synthetic_actors is None:
        if known.actors_per_process is not None:
            raise UserError("--actors-per-process sets how --synthetic-actors share processes; add --synthetic-actors N")
        return None
    import os

    from impactrl.runtime.synthetic import Synthetic

    count = known.synthetic_actors
    if count < 1:
        raise UserError(f"--synthetic-actors must be >= 1, got {count}")
    processes = max(1, (os.cpu_count() or 2) - 1)
    per_process = known.actors_per_process or -(-count // processes)
    if not 1 <= per_process <= count:
        raise UserError(f"--actors-per-process must be between 1 and --synthetic-actors ({count}), got {per_process}")
    return Synthetic(actors_per_process=per_process)


def evaluate(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="impactrl eval", description="Play episodes with a trained agent "
                            "(whole games, no episodic life) and print one JSON line.")
    parser.add_argument("path", type=Path, help="run directory (its latest checkpoint) or a checkpoint file")
    parser.add_argument("--episodes", type=int, default=30, help="episodes to play (default 30, as the Atari papers "
                        "report; Atari games start with the run's no-op starts)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the evaluation envs (default 12345)")
    parser.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    parser.add_argument("--num-envs", type=int, default=8, help="envs stepped in lockstep (default 8)")
    parser.add_argument("--video", type=Path, metavar="DIR",
                        help="write the first env's episodes to DIR as mp4 files (episode-000.mp4, ...; per task "
                        "DIR/TASK/ for a multi-task agent)")
    parser.add_argument("--reference", type=Path, nargs="+", default=[], metavar="RUN",
                        help="multi-task agent: single-task runs (run directories or checkpoints) on its tasks; "
                        "each task's score is (R - R_random) / (R_reference - R_random), and score their mean")
    parser.add_argument("--sticky-action-prob", type=float, metavar="P",
                        help="Atari: repeat the previous action with probability P (default: as the run trained; "
                        "0.25 is the v5 games' own)")
    parser.add_argument("--max-episode-steps", type=int, metavar="N", help="cut an episode after N agent steps "
                        "(default: the run's or the env's own time limit; Atari 27,000; else 100,000)")
    args = parser.parse_args(list(argv))
    if args.sticky_action_prob is not None and not 0.0 <= args.sticky_action_prob <= 1.0:
        raise UserError(f"--sticky-action-prob must be in [0, 1], got {args.sticky_action_prob:g}")
    if args.episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {args.episodes}")
    if args.num_envs < 1:
        raise UserError(f"--num-envs must be >= 1, got {args.num_envs}")
    import torch

    from impactrl.evaluation import evaluate_checkpoint
    from impactrl.metrics import json_line

    # A few envs per forward pass: more threads only add synchronisation (much slower on a busy machine).
    torch.set_num_threads(1)
    result = evaluate_checkpoint(args.path, args.episodes, seed=args.seed, greedy=args.greedy, num_envs=args.num_envs,
                                 sticky_action_prob=args.sticky_action_prob,
                                 video_dir=args.video, references=args.reference,
                                 max_episode_steps=args.max_episode_steps)
    print(json_line(result))
    return 0


def plot(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="impactrl plot", description="Plot learning curves of runs into a PNG.")
    parser.add_argument("runs", type=Path, nargs="+", help="run directories (each with metrics.jsonl)")
    parser.add_argument("--out", type=Path, default=Path("curves.png"), help="PNG to write (default curves.png)")
    parser.add_argument("--x", default="env_steps", help="x axis key (default env_steps; wall_time_s for time)")
    parser.add_argument("--y", default="episode_return_mean", help="y axis key (default episode_return_mean)")
    parser.add_argument("--title", help="figure title")
    parser.add_argument("--each-run", action="store_true", help="a line per run instead of one per group of runs "
                        "that differ only in their seed (their mean, with the band from the lowest to the highest)")
    parser.add_argument("--smooth", type=float, metavar="SPAN", help="each point the mean of the values over this "
                        "span of the x axis before it (e.g. 100000 env steps), whatever the runs' log interval")
    args = parser.parse_args(list(argv))
    if args.smooth is not None and not args.smooth > 0:
        raise UserError(f"--smooth must be a positive span of the x axis, got {args.smooth:g}")
    check_out(args.out, directory=False)
    from impactrl.plotting import plot_runs

    print(plot_runs(args.runs, args.out, args.x, args.y, args.title, args.each_run, args.smooth))
    return 0


def diagnose(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="impactrl diagnose", description="Check a run's metrics against the "
                            "troubleshooting rules (docs/guide.md) and say what to change.")
    parser.add_argument("run", type=Path, help="run directory (finished or still running)")
    args = parser.parse_args(list(argv))
    from impactrl.diagnostics import report

    print(report(args.run))
    return 0


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train, "eval": evaluate, "plot": plot, "bench": bench, "diagnose": diagnose}
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] not in commands:
        print(f"impactrl: error: unknown command {argv[0]!r} (use train, eval, plot, bench or diagnose)", file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(commands[argv[0]](argv[1:]))
    except UserError as error:
        print(f"impactrl {argv[0]}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except (ActorFailed, LearnerFailed, TrainingDiverged) as error:
        print(f"impactrl {argv[0]}: {stopped(error)}", file=sys.stderr)
        sys.exit(1)
    except RunDirFailed as error:
        print(f"impactrl {argv[0]}: error: {run_dir_failed(error)}", file=sys.stderr)
        sys.exit(3)
    except KeyboardInterrupt as error:
        # Exiting already: another Ctrl-C or SIGTERM would only break the exit with a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(f"impactrl: {stopped(error)}", file=sys.stderr)
        sys.exit(130)
