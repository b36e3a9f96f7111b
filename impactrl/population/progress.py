"""What ``impactrl tune`` prints while it runs: a line per trial result and per exploit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ray import tune


def settings_text(values: dict, names: Sequence[str]) -> str:
    return " ".join(f"{name}={values[name]:.4g}" for name in names if isinstance(values.get(name), (int, float)))


class Progress(tune.Callback):
    def __init__(self, names: Sequence[str], exploits: Path):
        self.names, self.exploits, self.shown = list(names), str(exploits), 0

    def setup(self, **info):  # a resumed experiment's exploits were shown before
        path = Path(self.exploits)
        self.shown = len(path.read_text().splitlines()) if path.is_file() else 0

    def on_trial_result(self, iteration, trials, trial, result, **info):
        value = result.get("episode_return_mean")
        shown = "-" if value is None or value == float("-inf") else f"{value:.2f}"
        print(f"[tune] {trial.trial_id}: {result.get('env_steps', 0):>12,} env steps  return {shown}  "
              f"{settings_text(result.get('config', trial.config), self.names)}", flush=True)
        self.show_exploits()

    def on_trial_error(self, iteration, trials, trial, **info):
        print(f"[tune] {trial.trial_id}: failed (Tune restarts it from its last checkpoint while "
              "--max-failures allows)", flush=True)

    def show_exploits(self) -> None:
        path = Path(self.exploits)
        lines = path.read_text().splitlines() if path.is_file() else []
        for line in lines[self.shown:]:
            exploit = json.loads(line)
            after = {name: values["after"] for name, values in exploit["settings"].items()}
            print(f"[tune] {exploit['trial']} takes {exploit['source']}'s checkpoint at "
                  f"{exploit['env_steps']:,} env steps, explores {settings_text(after, self.names)}", flush=True)
        self.shown = len(lines)
