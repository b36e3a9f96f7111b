"""Where a run's settings come from, later ones winning: the defaults < the presets (the env
family's, the algorithm's, the algorithm's for the family, a suite's; for ``--resume``, the run's
own ``config.yaml`` instead) < a ``--config`` file < the Python API's settings < flags.

``impactrl.train`` has no flags: ``resolve``. ``impactrl train`` parses its flags onto the config
``layered`` returns and hands the result to ``finished``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Mapping

from impactrl.config.checks import envs_split_for_learners, unread_settings
from impactrl.config.files import coerce, load_yaml, preset_values
from impactrl.config.settings import TrainConfig
from impactrl.errors import UserError


def layered(*, resume: Path | None = None, config_file: Path | None = None, settings: Mapping[str, Any] | None = None,
            source: str = "config", env: str | None = None, algo: str | None = None,
            presets: bool = True) -> tuple[TrainConfig, set[str]]:
    """The config below the flags, and the names the file and ``settings`` gave (``source`` names
    the settings in errors; they are checked like the file's).

    ``env`` and ``algo`` are the flags': they pick the presets, and ``env`` wins over the file and
    the settings (``algo`` is left to the flags' parser, which checks its choices). ``presets=False``
    leaves the presets out (``--help`` shows the plain defaults, without loading env registries)."""
    given = load_yaml(config_file) if config_file is not None else {}
    given.update(coerce(dict(settings or {}), source, warn_renamed=True))
    if resume is not None:
        values = resumed_values(resume)
    elif presets:
        from impactrl.envs.tasks import tasks_family

        env_id = env or given.get("env") or TrainConfig.env
        values = preset_values(algo or given.get("algo") or TrainConfig.algo, tasks_family(env_id), env_id)
    else:
        values = {}
    values.update(given)
    if env is not None:
        values["env"] = env
    return dataclasses.replace(TrainConfig(), **coerce(values, "config")), set(given)


def resumed_values(run_dir: Path) -> dict[str, Any]:
    """The settings of the run in ``run_dir`` (its ``config.yaml``), with ``out`` the directory itself."""
    saved = run_dir / "config.yaml"
    if not os.path.isfile(saved):  # False too for a name too long to exist
        raise UserError(f"--resume {run_dir}: no config.yaml there, so it is not an impactrl run directory")
    values = load_yaml(saved)
    values["out"] = run_dir
    return values


def finished(config: TrainConfig, given: set[str], resumed: bool) -> TrainConfig:
    """``config`` with a preset's envs per actor split over several learners (a new run only; a note
    on stderr says so), and a warning on stderr for each setting in ``given`` the run does not read."""
    from impactrl.envs.tasks import tasks_family

    if not resumed:
        config, note = envs_split_for_learners(config, given)
        if note is not None:
            print(f"impactrl train: note: {note}", file=sys.stderr)
    for problem in unread_settings(config, given, tasks_family(config.env)):
        print(f"impactrl train: warning: {problem}; ignored", file=sys.stderr)
    return config


def resolve(*, resume: Path | None = None, config_file: Path | None = None, settings: Mapping[str, Any] | None = None,
            source: str = "config") -> TrainConfig:
    """A run's whole config where no flags are given (``impactrl.train``): ``layered``, then ``finished``."""
    config, given = layered(resume=resume, config_file=config_file, settings=settings, source=source)
    return finished(config, given, resume is not None)
