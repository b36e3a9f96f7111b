"""The one exception type for mistakes a user can make (bad config, env id, checkpoint), the
ones that stop a run, and what the CLI says when one does.

The CLI turns a ``UserError`` into one line on stderr and exit code 2, before any process
starts; everything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """A problem with what the user asked for, explained in one line."""


class ActorFailed(RuntimeError):
    """An actor failed beyond what restarts can fix; the learner checkpointed and stopped."""


class EnvBroken(RuntimeError):
    """An actor's envs raised on every reset after rebuilds: retrying cannot help."""


class TrainingDiverged(RuntimeError):
    """Too many updates in a row had a non-finite loss or gradient; the learner checkpointed and stopped."""


def stopped(error: BaseException) -> str:
    """What the CLI says when training stops before its end (Ctrl-C, SIGTERM, ActorFailed,
    TrainingDiverged): on stderr and, written by the run itself, in train.log."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted; the latest checkpoint is kept (continue with --resume)"
    return f"{error}\nthe latest checkpoint is kept; continue with --resume"
