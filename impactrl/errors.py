"""The one exception type for mistakes a user can make (bad config, env id, checkpoint), the
ones that stop a run, and what the CLI says when one does.

The CLI turns a ``UserError`` into one line on stderr and exit code 2, before any process
starts, and a ``RunDirFailed`` into one line and exit code 3; everything else is a bug and keeps
its traceback.
"""

from pathlib import Path


class UserError(ValueError):
    """A problem with what the user asked for, explained in one line."""


class RunDirFailed(RuntimeError):
    """A write to the run directory failed mid-run (a full disk, made read-only, deleted): the run stops."""


def write_failed(run_dir: Path, path: Path, error: OSError) -> RunDirFailed:
    """The one line for a failed write of ``path`` in ``run_dir``: its cause, or that the directory went."""
    if not Path(run_dir).is_dir():
        return RunDirFailed(f"the run directory {run_dir} was deleted (or moved) while the run wrote to it; "
                            "nothing was recreated")
    return RunDirFailed(f"cannot write {path}: {error.strerror or error}")


def run_dir_failed(error: RunDirFailed) -> str:
    """What the CLI says: the first failure (a last checkpoint may have failed after it, or been written)."""
    first = error
    while isinstance(first.__context__, RunDirFailed):
        first = first.__context__
    if "was deleted" in str(first):
        return f"{first}; the run stopped"
    return f"{first}; the run stopped (--resume continues from its newest checkpoint once that is fixed)"


class ActorFailed(RuntimeError):
    """An actor failed beyond what restarts can fix; the learner checkpointed and stopped."""


class LearnerFailed(RuntimeError):
    """With several learners: one of them died or failed; learner 0 checkpointed and stopped."""


class EnvBroken(RuntimeError):
    """An actor's envs raised on every reset after rebuilds: retrying cannot help."""


class TrainingDiverged(RuntimeError):
    """Too many updates in a row had a non-finite loss or gradient; the learner checkpointed and stopped."""


def stopped(error: BaseException) -> str:
    """What the CLI says when training stops before its end (Ctrl-C, SIGTERM, ActorFailed,
    TrainingDiverged): on stderr and, written by the run itself, in train.log."""
    if isinstance(error, KeyboardInterrupt):  # impactrl tune says how its experiment continues
        return str(error) or "interrupted; the latest checkpoint is kept (continue with --resume)"
    return f"{error}\nthe latest checkpoint is kept; continue with --resume"
