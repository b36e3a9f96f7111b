"""Networks: torsos (observation encoders), policy/value heads, and the recurrent agent."""

from impactrl.models.agent import (
    Agent,
    AgentInput,
    AgentOutput,
    build_agent,
    build_torso,
    supported_torsos,
)
from impactrl.models.heads import CategoricalHead, GaussianHead, PolicyHead, ValueHead
from impactrl.models.normalization import RunningNorm
from impactrl.models.torsos import (
    DEAD_UNIT_SAMPLE,
    MinAtarTorso,
    MLPTorso,
    NatureCNNTorso,
    ResNetTorso,
    ShallowCNNTorso,
)

__all__ = [
    "DEAD_UNIT_SAMPLE",
    "Agent",
    "AgentInput",
    "AgentOutput",
    "build_agent",
    "build_torso",
    "supported_torsos",
    "PolicyHead",
    "CategoricalHead",
    "GaussianHead",
    "RunningNorm",
    "ValueHead",
    "MLPTorso",
    "MinAtarTorso",
    "ShallowCNNTorso",
    "NatureCNNTorso",
    "ResNetTorso",
]
