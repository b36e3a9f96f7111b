"""What a population did, on disk: ``pbt.jsonl`` (a line per exploit and explore, which
``schedulers`` writes as they happen) and ``summary.json`` (each trial's final return and lineage,
written at the end). Read without Ray: ``impactrl plot`` and ``eval`` take an experiment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from impactrl.errors import UserError

SPEC = "population.yaml"  # what impactrl tune was asked (experiment.Population)
EXPLOITS = "pbt.jsonl"
SUMMARY = "summary.json"


def read_exploits(experiment: Path) -> list[dict[str, Any]]:
    path = Path(experiment) / EXPLOITS
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def lineage(trial: str, exploits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Whose training ``trial``'s final agent carries, oldest first: ``{"trial", "from_env_steps"}``
    spans, each trial's own training from where it took over (an exploit copies the source's
    checkpoint, so the source's history up to then is the trial's)."""
    spans: list[dict[str, Any]] = []
    current, until = trial, float("inf")
    while True:
        earlier = [line for line in exploits if line["trial"] == current and (line["env_steps"] or 0) < until]
        if not earlier:
            spans.append({"trial": current, "from_env_steps": 0})
            return spans[::-1]
        last = max(earlier, key=lambda line: (line["env_steps"] or 0, line["time"]))
        spans.append({"trial": current, "from_env_steps": last["env_steps"]})
        current, until = last["source"], last["env_steps"]


def write_summary(experiment: Path, trials: list[dict[str, Any]]) -> dict[str, Any]:
    """``summary.json``: each trial (id, run directory, env steps, final return, final settings,
    lineage) and the best one."""
    exploits = read_exploits(experiment)
    for trial in trials:
        trial["lineage"] = lineage(trial["trial"], exploits)
    finished = [trial for trial in trials if trial["return"] is not None]
    best = max(finished, key=lambda trial: trial["return"])["trial"] if finished else None
    summary = {"best": best, "exploits": len(exploits), "trials": trials}
    path = Path(experiment) / SUMMARY
    path.with_suffix(".partial").write_text(json.dumps(summary, indent=1))
    path.with_suffix(".partial").replace(path)
    return summary


def is_experiment(path: Path) -> bool:
    """Whether ``path`` is an ``impactrl tune`` experiment directory."""
    return (Path(path) / SPEC).is_file()


def best_run_dir(experiment: Path) -> Path:
    """The run directory of the best trial ``summary.json`` names (``impactrl eval EXPERIMENT``)."""
    path = Path(experiment) / SUMMARY
    if not path.is_file():
        raise UserError(f"{experiment} has no {SUMMARY} yet (written when impactrl tune ends): evaluate a trial, "
                        f"{Path(experiment) / 'trials' / 'TRIAL_ID'}")
    summary = json.loads(path.read_text())
    best = next((trial for trial in summary["trials"] if trial["trial"] == summary["best"]), None)
    if best is None:
        raise UserError(f"{path}: no trial finished an episode, so none is best")
    return Path(best["run_dir"])


def interval_results(experiment: Path) -> dict[str, list[dict[str, Any]]]:
    """Each trial's results as it reported them to Tune at the end of each interval (Tune's
    ``result.json``), by trial id, in env-step order; a line cut short by a kill is left out."""
    found: dict[str, list[dict[str, Any]]] = {}
    for path in Path(experiment).glob("*/result.json"):
        for line in path.read_text().splitlines():
            try:
                result = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(result, dict) and "trial_id" in result and "env_steps" in result:
                found.setdefault(result["trial_id"], []).append(result)
    return {trial: sorted(lines, key=lambda line: line["env_steps"]) for trial, lines in found.items()}


def best_trial(experiment: Path) -> str | None:
    """The best trial ``summary.json`` names, None before the experiment has ended."""
    path = Path(experiment) / SUMMARY
    return json.loads(path.read_text())["best"] if path.is_file() else None
