"""impactrl: scalable actor-learner reinforcement learning (IMPALA, IMPACT, PPO)."""

__version__ = "0.1.0"

__all__ = ["TrainResult", "TuneResult", "train", "tune", "__version__"]


def __getattr__(name: str):
    # On first use, so that `impactrl --help` answers without importing Gymnasium and torch.
    if name in ("TrainResult", "train"):
        from impactrl import api

        return getattr(api, name)
    if name in ("TuneResult", "tune"):
        from impactrl import population

        return getattr(population, name)
    raise AttributeError(f"module 'impactrl' has no attribute {name!r}")
