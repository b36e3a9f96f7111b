"""``impactrl`` on the command line: each command parses its arguments, calls the library and
prints what it returns. ``impactrl train`` parses its flags (tyro, onto the settings below them:
``impactrl.config.resolve``) and calls ``impactrl.train``, the entry the Python API uses too.

Every mistake a user can make is a ``UserError`` from the parser or the library, raised before any
process starts or any file is written; ``main`` prints it as one line on stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import NamedTuple, Sequence

from impactrl.config import TrainConfig, renamed_flags
from impactrl.config.renamed import old_flags_help
from impactrl.config.resolve import finished, layered
from impactrl.errors import ActorFailed, LearnerFailed, RunDirFailed, TrainingDiverged, UserError, run_dir_failed, stopped
from impactrl.flags import flag_name, parse_train_flags
from impactrl.preflight import check_checkpoint_choice, check_out

USAGE = """usage: impactrl {train,tune,eval,plot,bench,diagnose} ...

  impactrl train --algo impala --env CartPole-v1 --out runs/cartpole   train (see impactrl train --help)
  impactrl train --resume RUN_DIR [--checkpoint NAME]                  continue a stopped run
  impactrl tune --env MinAtar/Breakout-v1 --explore learning-rate=1e-4..3e-3:log --out runs/pbt
                                                                       a population under Ray Tune (PBT)
  impactrl eval RUN_DIR_OR_CHECKPOINT --episodes 20                    evaluate, print one JSON line
  impactrl plot RUN_DIR [RUN_DIR ...] --out curves.png                 learning curves
  impactrl bench --env ALE/Pong-v5 --seconds 60                        throughput and where the time goes
  impactrl diagnose RUN_DIR                                            what went wrong and what to change
"""
TRAIN_HELP = ("  --config FILE.yaml    settings to start from (flags override them)\n"
              "  --resume RUN_DIR      continue the run in RUN_DIR from its newest readable checkpoint\n"
              "  --checkpoint NAME     with --resume: continue from this one instead (e.g. ckpt_0000001200)\n"
              "  --quiet               nothing on the terminal (RUN_DIR/train.log still gets every line)\n"
              "{old_flags}"
              "Defaults below are before presets: the env family's and the algorithm's (impactrl/configs/)\n"
              "apply on top of them.\n")
BENCH_HELP = """impactrl bench [TRAIN FLAGS] [--seconds 60] [--warmup-seconds 15] [--synthetic-actors N
               [--actors-per-process K]] [--no-learning] [--json]

Train for --seconds in a scratch directory and report env steps/s after the warm-up, with
the actors' time split (env, inference, wait) and the learner's (receive, assemble, transfer,
train, publish). Takes every flag of impactrl train (see impactrl train --help).

  --synthetic-actors N    N simulated actors replay unrolls recorded from --env (no env step,
                          no inference) as fast as the learner takes them: its intake alone
  --actors-per-process K  simulated actors per process (default: N spread over the cores
                          the learner leaves)
  --no-learning           the learner receives, assembles, transfers and publishes, but takes
                          no SGD step and leaves the observation statistics as they are
  --json                  print only one JSON object"""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one line and exit code 2 like every other mistake,
    not argparse's usage block."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


class TrainRequest(NamedTuple):
    config: TrainConfig
    resume: Path | None  # the run directory to continue
    checkpoint: str | None  # the checkpoint named with --checkpoint
    quiet: bool  # --quiet: nothing on the terminal (train.log still gets it all)


def resolve_train_config(argv: Sequence[str]) -> TrainRequest:
    """``impactrl train``'s arguments: the run's config, the settings of ``impactrl.config.resolve``
    (presets or the resumed run's config < --config FILE.yaml) with the flags on top."""
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
    check_checkpoint_choice(known.resume, known.checkpoint)
    if known.algo is not None:
        rest += ["--algo", known.algo]  # the flags' parser checks its choices
    base, given = layered(resume=known.resume, config_file=known.config, env=known.env, algo=known.algo,
                          presets=not help_only)
    if help_only:
        print(TRAIN_HELP.format(old_flags=old_flags_help()))
    config = parse_train_flags(base, rest)
    given |= {flag_name(arg) for arg in rest if arg.startswith("--")}
    return TrainRequest(finished(config, given, known.resume is not None), known.resume, known.checkpoint, known.quiet)


def train(argv: Sequence[str]) -> int:
    request = resolve_train_config(argv)
    from impactrl.api import train as train_run

    result = train_run(config=request.config, resume=request.resume, checkpoint=request.checkpoint,
                       quiet=request.quiet, invocation=["train", *argv])
    print(f"done: {result.env_steps:,} env steps, {result.updates:,} learner updates, "
          f"{result.wall_time_s:.1f}s; run in {result.run_dir}")
    return 0


def tune(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="impactrl tune", add_help=False, description="Train a population of runs under "
                            "Ray Tune and keep the best (docs/tune.md). Every other flag is an impactrl train flag "
                            "for every trial (--quiet: only the final line); each trial trains to "
                            "--total-env-steps in DIR/trials/TRIAL_ID.")
    add = parser.add_argument
    add("--explore", action="append", default=[], metavar="NAME=LOW..HIGH[:log]", help="a numeric train setting to "
        "explore in that range, log-uniformly with :log (e.g. learning-rate=1e-4..3e-3:log); repeat for more")
    add("--population", type=int, default=4, help="trials (default 4)")
    add("--initial", action="append", default=[], metavar="NAME=V1,...,VN", help="each trial's starting value of "
        "an explored setting; the others are drawn from their ranges")
    add("--search", default="pbt", help="pbt (default): the worst take a copy of a best trial's checkpoint and "
        "perturb its settings (x0.8 or x1.2, or a fresh draw with probability 0.25); pb2: the new settings from "
        "a Gaussian-process bandit; random: no exploit, the starting points alone")
    add("--interval-env-steps", type=int, help="env steps between comparisons (default a twentieth of the budget)")
    add("--quantile-fraction", type=float, default=0.25, help="the share exploited, and exploited from (0.25)")
    add("--cpus-per-trial", type=float, help="CPUs a trial reserves (default its learners plus actors)")
    add("--max-failures", type=int, default=2, help="restarts of a failed trial from its checkpoint (default 2)")
    add("--ray-address", help="a Ray cluster's address (default: a local Ray instance)")
    add("--out", type=Path, help="the experiment directory (default runs/tune-ENV-ALGO)")
    add("--resume", type=Path, metavar="DIR", help="continue a stopped experiment; no trial starts over")
    known, rest = parser.parse_known_args(list(argv))
    if "-h" in rest or "--help" in rest:
        print(parser.format_help())
        return 0
    from impactrl.population import tune as tune_population

    if known.resume is not None:
        if rest or known.explore or known.initial:
            raise UserError("--resume continues the experiment as it was asked; give no other settings")
        result = tune_population(resume=known.resume, ray_address=known.ray_address)
    else:
        if known.out is not None:
            check_out(known.out, directory=True)
        base = resolve_train_config(rest)
        options = {name: value for name, value in vars(known).items() if name != "resume"}
        result = tune_population(**options, quiet=base.quiet, config=base.config)
    best = "no trial finished an episode" if result.best_run_dir is None else (
        f"best {result.best_return:.2f} in {result.best_run_dir}")
    print(f"done: {len(result.trials)} trials, {result.exploits} exploits; {best}; {result.experiment / 'summary.json'}")
    failed = [trial for trial in result.trials if trial["error"] is not None]
    for trial in failed:
        print(f"impactrl tune: trial {trial['trial']} failed beyond --max-failures: {trial['error']}", file=sys.stderr)
    return 1 if failed else 0


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
        print(BENCH_HELP)
        return 0
    if not known.seconds > known.warmup_seconds >= 0:
        raise UserError(f"--seconds ({known.seconds}) must exceed --warmup-seconds ({known.warmup_seconds})")
    from impactrl.bench import format_summary, run_bench, synthetic_actors
    from impactrl.metrics import json_line

    synthetic = synthetic_actors(known.synthetic_actors, known.actors_per_process)
    if synthetic is not None:
        rest += ["--num-actors", str(known.synthetic_actors)]
    config = resolve_train_config([*rest, "--total-env-steps", str(10**12), "--max-wall-time-s", str(known.seconds),
                                   "--log-interval-s", "2", "--checkpoint-interval-s", str(10**9)]).config
    result = run_bench(config, known.warmup_seconds, synthetic, learn=not known.no_learning)
    if not known.json:
        print(format_summary(result, config.env, config.algo))
    print(json_line(result))
    return 0


def evaluate(argv: Sequence[str]) -> int:
    parser = ArgumentParser(prog="impactrl eval", description="Play episodes with a trained agent "
                            "(whole games, no episodic life) and print one JSON line.")
    parser.add_argument("path", type=Path, help="run directory (its latest checkpoint), a checkpoint file, or an "
                        "impactrl tune experiment (its best trial's latest checkpoint)")
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
    if not 0 <= args.seed < 2**31 - args.num_envs:  # env e is seeded seed + e, a 32-bit signed seed
        raise UserError(f"--seed must be in [0, {2**31 - args.num_envs - 1}], got {args.seed}")
    import torch

    from impactrl.evaluation import evaluate_checkpoint
    from impactrl.metrics import json_line
    from impactrl.population.record import best_run_dir, is_experiment

    if is_experiment(args.path):
        args.path = best_run_dir(args.path)

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
    parser.add_argument("runs", type=Path, nargs="+", help="run directories (each with metrics.jsonl) or curves kept as "
                        "CSV (a header of metric names, a row of numbers per line: docs/curves), or one "
                        "impactrl tune experiment (a curve per trial, the best trial's lineage marked)")
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
    from impactrl.plotting import plot_population, plot_runs
    from impactrl.population.record import is_experiment

    if len(args.runs) == 1 and is_experiment(args.runs[0]):
        print(plot_population(args.runs[0], args.out, args.x, args.y, args.title))
    else:
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
    commands = {"train": train, "tune": tune, "eval": evaluate, "plot": plot, "bench": bench, "diagnose": diagnose}
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] not in commands:
        print(f"impactrl: error: unknown command {argv[0]!r} (use train, tune, eval, plot, bench or diagnose)", file=sys.stderr)
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
