"""Runtimes move data and processes; the actor and learner loops are the same for all of them.

Each runtime module exposes ``run(config, learner, spec, run_dir, writer) -> LearnerCounters``:
it builds its own rollout storage from ``spec``, starts the actors, runs ``run_learner`` and
stops everything. ``--runtime`` picks one by name from ``RUNTIMES``; modules load on demand.
"""

from __future__ import annotations

import importlib

RUNTIMES = {"local": "impactrl.runtime.local"}


def get_runtime(name: str):
    return importlib.import_module(RUNTIMES[name])
