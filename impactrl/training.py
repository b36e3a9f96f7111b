"""Assemble a training run from a validated config and hand it to a runtime."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from impactrl.algos import make_algorithm
from impactrl.build import make_agent, make_training_envs, rollout_spec
from impactrl.config import TrainConfig
from impactrl.data.rollout import SlotStore
from impactrl.metrics import MetricsWriter
from impactrl.runtime import local
from impactrl.runtime.learner import Learner, LearnerCounters


def build_learner(config: TrainConfig, checkpoint: dict | None) -> tuple[Learner, SlotStore]:
    torch.manual_seed(config.seed)
    env = make_training_envs(config, 1)
    try:
        agent = make_agent(config, env.observation_space, env.action_space)
        spec = rollout_spec(config, agent, env.observation_space)
    finally:
        env.close()
    device = torch.device(config.device)
    agent.to(device)
    learner = Learner(config, agent, make_algorithm(config, agent), device)
    if checkpoint is not None:
        learner.load_state_dict(checkpoint)
    return learner, SlotStore(spec, config.num_slots, shared=True)


def train_local(config: TrainConfig, run_dir: Path, checkpoint: dict | None = None,
                quiet: bool = False) -> LearnerCounters:
    torch.set_num_threads(local.learner_threads(config))
    learner, store = build_learner(config, checkpoint)
    writer = MetricsWriter(run_dir, terminal=None if quiet else sys.stdout)
    try:
        return local.run(config, learner, store, run_dir, writer)
    finally:
        writer.close()
