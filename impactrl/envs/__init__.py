"""Environments: ``make_env`` for Gymnasium, ALE (Atari) and MinAtar ids (see ``factory``), and
``make_env_vector`` for the E envs an actor steps, on Gymnasium or EnvPool (see ``vector``)."""

from impactrl.envs.factory import (
    CARTPOLE_NO_VELOCITY_ID,
    EnvFamily,
    EnvOptions,
    check_env_id,
    env_family,
    make_env,
    register_all,
)
from impactrl.envs.vector import EnvBackend, EnvPoolEnvs, EnvVector, GymnasiumEnvs, VectorStep, make_env_vector
from impactrl.envs.wrappers import ChannelsFirstUint8, EpisodicLife, HideVelocity, PressFire

__all__ = [
    "CARTPOLE_NO_VELOCITY_ID",
    "EnvFamily",
    "EnvOptions",
    "check_env_id",
    "env_family",
    "make_env",
    "make_env_vector",
    "EnvBackend",
    "EnvVector",
    "EnvPoolEnvs",
    "GymnasiumEnvs",
    "VectorStep",
    "register_all",
    "ChannelsFirstUint8",
    "EpisodicLife",
    "PressFire",
    "HideVelocity",
]
