"""impactrl: scalable actor-learner reinforcement learning (IMPALA, IMPACT, PPO)."""

__version__ = "0.1.0"

from impactrl.api import TrainResult, train  # noqa: E402

__all__ = ["TrainResult", "train", "__version__"]
