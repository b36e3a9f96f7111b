"""What a population did, on disk: ``pbt.jsonl`` (a line per exploit and explore, written as they
happen) and ``summary.json`` (each trial's final return and lineage, written at the end)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.schedulers.pb2 import PB2

EXPLOITS = "pbt.jsonl"
SUMMARY = "summary.json"


class RecordsExploits:
    """A PBT scheduler that appends each exploit to ``pbt.jsonl``: the env steps the source had
    reached, the trial, its source, and each explored setting before, in the source, and after
    the explore step."""

    def __init__(self, *args, record: Path, names: Iterable[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.record, self.names = str(record), list(names)

    def _exploit(self, tune_controller, trial, trial_to_clone):  # PBT's own hook (and PB2's)
        before = {name: trial.config.get(name) for name in self.names}
        source = {name: trial_to_clone.config.get(name) for name in self.names}
        result = self._trial_state[trial_to_clone].last_result or {}
        score = self._trial_state[trial].last_score
        super()._exploit(tune_controller, trial, trial_to_clone)
        line = {"time": time.time(), "env_steps": result.get("env_steps"), "trial": trial.trial_id,
                "source": trial_to_clone.trial_id, "trial_return": score, "source_return": result.get(self._metric),
                "settings": {name: {"before": before[name], "source": source[name], "after": trial.config.get(name)}
                             for name in self.names}}
        with open(self.record, "a") as file:
            file.write(json.dumps(line) + "\n")


    def choose_trial_to_run(self, tune_controller):
        """Ray's synchronous PBT sets the next sync point to at most the furthest trial's time: when
        every trial comes back at or past it (a restored experiment starts its scheduler afresh, at
        time 0), none would be chosen and the experiment would wait forever. Then the next sync is
        an interval past the furthest trial."""
        chosen = super().choose_trial_to_run(tune_controller)
        waiting = [trial for trial in tune_controller.get_trials() if trial.status in (Trial.PENDING, Trial.PAUSED)]
        if (chosen is None and self._synch and waiting and len(waiting) == len(tune_controller.get_live_trials())
                and all(self._trial_state[trial].last_train_time >= self._next_perturbation_sync for trial in waiting)):
            furthest = max(self._trial_state[trial].last_train_time for trial in waiting)
            self._next_perturbation_sync = furthest + self._perturbation_interval
            chosen = super().choose_trial_to_run(tune_controller)
        return chosen


class RecordedPBT(RecordsExploits, PopulationBasedTraining):
    pass


class RecordedPB2(RecordsExploits, PB2):
    pass


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
