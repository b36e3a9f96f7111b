"""The one exception type for mistakes a user can make (bad config, env id, checkpoint).

The CLI turns a ``UserError`` into one line on stderr and exit code 2, before any process
starts; everything else is a bug and keeps its traceback.
"""


class UserError(ValueError):
    """A problem with what the user asked for, explained in one line."""


class ActorFailed(RuntimeError):
    """An actor died during training; the learner checkpointed and stopped."""
