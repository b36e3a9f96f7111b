"""impactrl: scalable actor-learner reinforcement learning (IMPALA, IMPACT, PPO)."""

__version__ = "0.1.0"
