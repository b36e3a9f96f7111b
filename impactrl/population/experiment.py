"""``impactrl.tune``: a population of impactrl runs under Ray Tune, with PBT, PB2 or neither.

The experiment directory (``out``) holds ``population.yaml`` (what was asked, for ``--resume``),
Tune's own state, ``trials/TRIAL_ID/`` (each trial an impactrl run directory: config.yaml,
metrics.jsonl, TensorBoard, checkpoints), ``pbt.jsonl`` and ``summary.json`` (``record``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import yaml

from impactrl.config import TrainConfig, coerce, to_yaml, unread_settings
from impactrl.errors import UserError
from impactrl.population.record import SPEC
from impactrl.population.space import Explored, parse_explored, parse_initial, starting_points

SEARCHES = ("pbt", "pb2", "random")
METRIC = "episode_return_mean"  # the mean return of a trial's last 100 training episodes


@dataclasses.dataclass(frozen=True)
class Population:
    """What ``impactrl tune`` was asked for: enough to build the experiment again on ``--resume``."""

    base: TrainConfig
    explored: tuple[Explored, ...]
    starts: tuple[dict[str, Any], ...]  # each trial's starting values of the explored settings
    search: str
    interval_env_steps: int
    cpus_per_trial: float | None  # None: the trial's processes, at most a node's CPUs (trial_cpus)
    quantile_fraction: float
    max_failures: int

    @property
    def size(self) -> int:
        return len(self.starts)

    def to_yaml(self) -> str:
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        values["base"] = yaml.safe_load(to_yaml(self.base))
        values["explored"] = [dataclasses.asdict(item) for item in self.explored]
        values["starts"] = list(self.starts)
        return yaml.safe_dump(values, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> Population:
        values = yaml.safe_load(text)
        values["base"] = dataclasses.replace(TrainConfig(), **coerce(values["base"], SPEC))
        values["explored"] = tuple(Explored(**item) for item in values["explored"])
        values["starts"] = tuple(values["starts"])
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class TuneResult:
    experiment: Path  # the experiment directory (pbt.jsonl, summary.json, trials/)
    best_run_dir: Path | None  # the best trial's run directory (impactrl eval takes it)
    best_return: float | None
    exploits: int
    trials: list[dict[str, Any]]  # summary.json's trials


def plan_population(base: TrainConfig, *, population: int, explore: Sequence[str], initial: Sequence[str],
                    search: str, interval_env_steps: int | None, cpus_per_trial: float | None,
                    quantile_fraction: float, max_failures: int) -> Population:
    """The population's plan, every setting checked (one line each) before Ray starts."""
    if search not in SEARCHES:
        raise UserError(f"--search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if population < 2:
        raise UserError(f"--population must be >= 2, got {population}")
    if not 0 < quantile_fraction <= 0.5:
        raise UserError(f"--quantile-fraction must be in (0, 0.5], got {quantile_fraction:g}")
    if max_failures < 0:
        raise UserError(f"--max-failures must be >= 0, got {max_failures}")
    for name in ("max_wall_time_s", "stop_at_return"):
        if getattr(base, name) is not None:
            raise UserError(f"--{name.replace('_', '-')}: every trial of a population trains for --total-env-steps, "
                            "so that they compare at equal env steps")
    if base.runtime != "local":
        raise UserError("--runtime ray: each trial runs its actors as local processes on the node Tune places it "
                        "on (Tune spreads the trials over the cluster: --ray-address)")
    from impactrl.envs.tasks import tasks_family

    explored = parse_explored(explore, base)
    unread = unread_settings(base, {item.name for item in explored}, tasks_family(base.env))
    if unread:
        raise UserError(f"--explore: {unread[0]}; exploring it would change nothing")
    interval = interval_env_steps if interval_env_steps is not None else max(base.total_env_steps // 20, 1)
    if not 0 < interval <= base.total_env_steps:
        raise UserError(f"--interval-env-steps must be in [1, --total-env-steps ({base.total_env_steps:,})], "
                        f"got {interval:,}")
    if cpus_per_trial is not None and not cpus_per_trial > 0:
        raise UserError(f"--cpus-per-trial must be > 0, got {cpus_per_trial:g}")
    starts = starting_points(explored, parse_initial(initial, explored, population), population, base.seed)
    return Population(base, tuple(explored), tuple(starts), search, interval, cpus_per_trial, quantile_fraction,
                      max_failures)


def check_trials(population: Population, trials_dir: Path) -> None:
    """Every trial's settings pass the checks ``impactrl train`` makes (the first in full, envs and
    memory included; the others' values as settings)."""
    from impactrl.config import problems
    from impactrl.population.trial import segment_config
    from impactrl.preflight import validate_train

    for index, start in enumerate(population.starts):
        config = segment_config(population.base, start, trials_dir / f"check_{index}", index,
                                population.base.total_env_steps)
        found = problems(config)
        if found:
            raise UserError(f"trial {index} ({', '.join(f'{k}={v:g}' for k, v in start.items())}): {found[0]}")
        if index == 0:
            validate_train(config, None)


def start_ray(address: str | None) -> bool:
    """Join the cluster at ``address``, or start a local Ray instance with a CPU per core (stopped
    with this process, however it ends); False where this process had joined one already (then it
    is left as it was)."""
    import ray

    from impactrl.runtime.ray.cluster import join, plain_output, reap_with_this_process

    if ray.is_initialized():
        return False
    if address is not None:
        join(address)
        return True
    plain_output()
    reap_with_this_process()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    return True


def trial_cpus(population: Population) -> float:
    """The CPUs a trial reserves: ``--cpus-per-trial``, else its learners and actor processes, at
    most the largest node's CPUs (with a note); one trial must fit on one node."""
    import ray

    largest = max((node["Resources"].get("CPU", 0) for node in ray.nodes() if node["Alive"]), default=0)
    if population.cpus_per_trial is not None:
        if population.cpus_per_trial > largest:
            raise UserError(f"--cpus-per-trial {population.cpus_per_trial:g}: the largest node of the Ray cluster "
                            f"has {largest:g} CPUs, and a trial runs on one node")
        return population.cpus_per_trial
    processes = population.base.num_learners + population.base.num_actors
    if processes <= largest:
        return float(processes)
    print(f"impactrl tune: note: a trial runs {processes} processes (learners and actors) and the largest node has "
          f"{largest:g} CPUs: each trial reserves {largest:g} (--cpus-per-trial sets it)", file=sys.stderr)
    return float(largest)


def tuner(population: Population, experiment: Path, cpus: float, quiet: bool, resume: bool):
    """Ray Tune's Tuner for ``population`` in ``experiment`` (restored from it with ``resume``)."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from impactrl.population.progress import Progress
    from impactrl.population.record import EXPLOITS
    from impactrl.population.schedulers import RecordedPB2, RecordedPBT
    from impactrl.population.trial import TRAINED_TO, ImpactrlTrial, TrialPlan

    plan = TrialPlan(population.base, experiment / "trials", population.interval_env_steps)
    trainable = tune.with_resources(tune.with_parameters(ImpactrlTrial, plan=plan), {"cpu": cpus})
    if resume:
        return tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True, resume_errored=True)
    names = [item.name for item in population.explored]
    shared = dict(time_attr=TRAINED_TO, perturbation_interval=population.interval_env_steps,
                  quantile_fraction=population.quantile_fraction, record=experiment / EXPLOITS, names=names, synch=True,
                  custom_explore_fn=clipped_to_ranges(population.explored), log_config=False)
    if population.search == "pbt":
        scheduler = RecordedPBT(hyperparam_mutations={item.name: item.domain() for item in population.explored},
                                **shared)
    elif population.search == "pb2":
        scheduler = RecordedPB2(hyperparam_bounds={item.name: [item.low, item.high] for item in population.explored},
                                **shared)
    else:
        scheduler = None
    return tune.Tuner(
        trainable,
        param_space={item.name: item.domain() for item in population.explored},
        tune_config=tune.TuneConfig(metric=METRIC, mode="max", num_samples=population.size, scheduler=scheduler,
                                    search_alg=BasicVariantGenerator(points_to_evaluate=list(population.starts)),
                                    reuse_actors=False),
        run_config=tune.RunConfig(
            name=experiment.name, storage_path=str(experiment.parent), verbose=0,
            callbacks=[] if quiet else [Progress(names, experiment / EXPLOITS)],
            stop={"env_steps": population.base.total_env_steps},
            failure_config=tune.FailureConfig(max_failures=population.max_failures),
            # Every step's end is a checkpoint: a failed trial restarts from its last, not from scratch.
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=4)))


def clipped_to_ranges(explored: Sequence[Explored]):
    """PBT's explore step, then each value back inside its range (×1.2 steps would leave it)."""
    ranges = {item.name: item for item in explored}

    def clip(config: dict[str, Any]) -> dict[str, Any]:
        return {**config, **{name: item.clip(config[name]) for name, item in ranges.items() if name in config}}
    return clip


def run_population(population: Population | None, experiment: Path, *, resume: bool, ray_address: str | None,
                   quiet: bool) -> TuneResult:
    """Train the population in ``experiment`` (or continue it, ``resume``) and summarise it."""
    import ray

    from impactrl.population.record import write_summary

    if resume:
        spec = experiment / SPEC
        if not spec.is_file():
            raise UserError(f"--resume {experiment}: no {SPEC} there, so it is not an impactrl tune experiment")
        population = Population.from_yaml(spec.read_text())
    else:
        if experiment.exists() and any(experiment.iterdir()):
            raise UserError(f"--out {experiment} already holds files; continue it with impactrl tune --resume "
                            f"{experiment} or pick a new --out")
        check_trials(population, experiment / "trials")
    started = start_ray(ray_address)
    try:
        cpus = trial_cpus(population)
        if not resume:
            experiment.mkdir(parents=True, exist_ok=True)
            (experiment / SPEC).write_text(population.to_yaml())
        with tune_output_off():
            results = tuner(population, experiment, cpus, quiet, resume).fit()
    finally:
        if started:
            ray.shutdown()
    trials = [trial_summary(result, population) for result in results]
    summary = write_summary(experiment, trials)
    if any(trial["error"] is None and (trial["env_steps"] or 0) < population.base.total_env_steps
           for trial in trials):  # Tune stops early only when interrupted
        raise KeyboardInterrupt(f"interrupted; every trial keeps its checkpoint of its last interval (continue "
                                f"with impactrl tune --resume {experiment})")
    best = next((trial for trial in trials if trial["trial"] == summary["best"]), None)
    return TuneResult(experiment, Path(best["run_dir"]) if best else None, best["return"] if best else None,
                      summary["exploits"], trials)


@contextlib.contextmanager
def tune_output_off():
    """Ray Tune's own report (a settings box, a TensorBoard hint for its own files, advice on
    reusing actors, which a trial that restarts its processes every interval cannot take) left
    out for the lines ``progress.Progress`` prints; the environment put back after."""
    before = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            yield
    finally:
        if before is None:
            del os.environ["RAY_AIR_NEW_OUTPUT"]
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = before


def trial_summary(result, population: Population) -> dict[str, Any]:
    """A trial's line in summary.json, from Tune's ``Result``: where it got, its final return and settings."""
    metrics = result.metrics or {}
    value = metrics.get(METRIC)
    return {"trial": metrics.get("trial_id") or Path(result.path).name, "run_dir": metrics.get("run_dir"),
            "env_steps": metrics.get("env_steps"), "return": value if value is not None and math.isfinite(value) else None,
            "settings": {item.name: (result.config or {}).get(item.name) for item in population.explored},
            "error": None if result.error is None else str(result.error).strip().splitlines()[-1]}
