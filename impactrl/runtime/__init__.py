"""Runtimes move data and processes; the actor and learner loops are the same for all of them.

Each runtime module exposes ``run(config, learner, spec, run_dir, writer, program) -> LearnerCounters``:
it builds its own rollout storage from ``spec``, starts actor processes that run ``program``
(runtime/actor.py's ``ActorProgram``), runs the learner loop (``supervision.supervise``) and
stops everything. It may also expose ``preflight(config)``, which raises UserError for what only
it can check (is it installed, can the cluster hold the actors) before anything starts.
``--runtime`` picks one by name from ``RUNTIMES``; modules load on demand.
"""

from __future__ import annotations

import importlib

RUNTIMES = {"local": "impactrl.runtime.local", "ray": "impactrl.runtime.ray"}


def get_runtime(name: str):
    return importlib.import_module(RUNTIMES[name])


def preflight(config) -> None:
    check = getattr(get_runtime(config.runtime), "preflight", None)
    if check is not None:
        check(config)
