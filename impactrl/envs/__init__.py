"""Environments: ``make_env`` for Gymnasium, ALE (Atari) and MinAtar ids; see ``factory``."""

from impactrl.envs.factory import (
    CARTPOLE_NO_VELOCITY_ID,
    EnvFamily,
    EnvOptions,
    check_env_id,
    env_family,
    make_env,
    register_all,
)
from impactrl.envs.wrappers import ChannelsFirstUint8, EpisodicLife, HideVelocity

__all__ = [
    "CARTPOLE_NO_VELOCITY_ID",
    "EnvFamily",
    "EnvOptions",
    "check_env_id",
    "env_family",
    "make_env",
    "register_all",
    "ChannelsFirstUint8",
    "EpisodicLife",
    "HideVelocity",
]
