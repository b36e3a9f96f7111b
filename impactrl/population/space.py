"""The settings a population explores: ``--explore NAME=LOW..HIGH[:log]`` ranges and the trials'
starting values (``--initial NAME=V1,V2,...``, one per trial), checked against the settings'
own bounds before anything starts."""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from dataclasses import dataclass
from typing import Any, Sequence

from impactrl.config import TrainConfig, problems
from impactrl.errors import UserError

# Settings whose change would make a checkpoint unloadable or the population incomparable.
NOT_EXPLORABLE = ("seed", "total_env_steps", "num_actors", "envs_per_actor", "num_learners", "unroll_length",
                  "unrolls_per_batch", "buffer_batches", "rollout_slots", "hidden_sizes", "lstm_size", "frame_stack")


@dataclass(frozen=True)
class Explored:
    """One setting's range: sampled (and resampled by PBT) uniformly, or log-uniformly with ``log``;
    PBT's ×0.8/×1.2 perturbations are clipped to it and rounded for an integer setting."""

    name: str  # a TrainConfig field
    low: float
    high: float
    log: bool
    integer: bool

    def sample(self, rng: random.Random) -> float | int:
        value = (math.exp(rng.uniform(math.log(self.low), math.log(self.high))) if self.log
                 else rng.uniform(self.low, self.high))
        return self.clip(value)

    def clip(self, value: float) -> float | int:
        value = min(max(value, self.low), self.high)
        return int(round(value)) if self.integer else float(value)

    def domain(self):
        """The range as a Ray Tune search space (what PBT resamples from)."""
        from ray import tune

        if self.integer:
            high = int(self.high) + 1  # Tune's integer ranges exclude the upper bound
            return tune.lograndint(int(self.low), high) if self.log else tune.randint(int(self.low), high)
        return tune.loguniform(self.low, self.high) if self.log else tune.uniform(self.low, self.high)


def numeric_type(name: str) -> type | None:
    """int or float for a numeric TrainConfig setting (``X | None`` included), else None."""
    hints = typing.get_type_hints(TrainConfig)
    if name not in hints:
        return None
    kinds = {kind for kind in typing.get_args(hints[name]) or (hints[name],) if kind is not type(None)}
    return kinds.pop() if kinds in ({int}, {float}) else None


def setting_of(text: str) -> str:
    """The setting a name in ``--explore`` or ``--initial`` stands for (``learning-rate`` -> ``learning_rate``)."""
    return text.strip().lstrip("-").replace("-", "_")


def setting_name(text: str, option: str) -> str:
    name = setting_of(text)
    if numeric_type(name) is None:
        raise UserError(f"{option} {text}: not a numeric training setting (see impactrl train --help)")
    if name in NOT_EXPLORABLE:
        raise UserError(f"{option} {text}: a population explores settings that keep the model, the data and the "
                        f"budget alike; {name} is not one")
    return name


def number(text: str, option: str, whole: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"{option} {whole}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise UserError(f"{option} {whole}: {text!r} is not a finite number")
    return value


def parse_explored(texts: Sequence[str], base: TrainConfig) -> list[Explored]:
    """``NAME=LOW..HIGH[:log]`` each, checked: a numeric setting, LOW < HIGH, both valid values of it."""
    explored: dict[str, Explored] = {}
    for text in texts:
        name_part, _, spec = text.partition("=")
        spec, _, scale = spec.partition(":")
        low_text, dots, high_text = spec.partition("..")
        if not dots or scale not in ("", "log"):
            raise UserError(f"--explore {text}: expected NAME=LOW..HIGH or NAME=LOW..HIGH:log "
                            "(e.g. learning-rate=1e-4..3e-3:log)")
        name = setting_name(name_part, "--explore")
        low, high = number(low_text, "--explore", text), number(high_text, "--explore", text)
        if not low < high:
            raise UserError(f"--explore {text}: LOW must be below HIGH")
        if scale == "log" and low <= 0:
            raise UserError(f"--explore {text}: a log scale needs LOW > 0")
        if name in explored:
            raise UserError(f"--explore names {name} twice")
        item = Explored(name, low, high, scale == "log", numeric_type(name) is int)
        for value in (item.clip(low), item.clip(high)):
            found = problems(dataclasses.replace(base, **{name: value}))
            if found:
                raise UserError(f"--explore {text}: {found[0]}")
        explored[name] = item
    if not explored:
        raise UserError("impactrl tune needs at least one --explore NAME=LOW..HIGH[:log] (e.g. "
                        "--explore learning-rate=1e-4..3e-3:log)")
    return list(explored.values())


def parse_initial(texts: Sequence[str], explored: Sequence[Explored], population: int) -> dict[str, list]:
    """``NAME=V1,...,VN`` each: trial i starts from Vi (N = the population), inside NAME's range."""
    ranges = {item.name: item for item in explored}
    initial: dict[str, list] = {}
    for text in texts:
        name_part, _, values_text = text.partition("=")
        name = setting_of(name_part)
        if name not in ranges:
            raise UserError(f"--initial {text}: {name} is not explored (add --explore {name_part}=LOW..HIGH)")
        values = [number(value, "--initial", text) for value in values_text.split(",")]
        if len(values) != population:
            raise UserError(f"--initial {text}: {len(values)} values for a population of {population}")
        item = ranges[name]
        outside = [value for value in values if not item.low <= value <= item.high]
        if outside:
            raise UserError(f"--initial {text}: {outside[0]:g} lies outside the explored range "
                            f"{item.low:g}..{item.high:g}")
        initial[name] = [item.clip(value) for value in values]
    return initial


def starting_points(explored: Sequence[Explored], initial: dict[str, list], population: int,
                    seed: int) -> list[dict[str, Any]]:
    """Each trial's starting values: its ``--initial`` ones, the others drawn from their ranges."""
    rng = random.Random(seed)
    return [{item.name: initial[item.name][index] if item.name in initial else item.sample(rng)
             for item in explored} for index in range(population)]
