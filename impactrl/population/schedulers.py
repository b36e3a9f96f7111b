"""Ray Tune's PBT and PB2 schedulers, recording each exploit in ``pbt.jsonl``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable

from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.schedulers.pb2 import PB2


class RecordsExploits:
    """A PBT scheduler that appends each exploit to ``pbt.jsonl`` (the env steps the source had
    reached, the trial, its source, and each explored setting before, in the source, and after
    the explore step), and whose synchronous mode survives a resume (``choose_trial_to_run``)."""

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
