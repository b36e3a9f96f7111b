"""``impactrl bench``: where the time goes in a short training run of any env and config.

It trains for a fixed wall time in a scratch directory, drops the warm-up, and reports the
end-to-end env steps per second with the actors' split (env stepping, inference, waiting for a
free slot or for new weights) and the learner's (receiving unrolls, assembling batches, moving
them to the device, training, publishing). With ``--synthetic-actors N`` the actors replay
recorded unrolls instead (runtime/synthetic.py): a load test of the learner's intake.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from impactrl import training
from impactrl.config import TrainConfig
from impactrl.data.rollout import ACTOR_STAGES, data_bytes
from impactrl.errors import UserError
from impactrl.metrics import read_metrics
from impactrl.preflight import validate_train
from impactrl.rundir import create_run_dir, write_config
from impactrl.runtime.actor import ENV_ACTORS
from impactrl.runtime.learner import LEARNER_STAGES
from impactrl.runtime.synthetic import Synthetic


def run_bench(config: TrainConfig, warmup_s: float, synthetic: Synthetic | None = None,
              learn: bool = True) -> dict[str, Any]:
    """Train ``config`` in a scratch directory (removed after) and measure it: ``summarize``'s
    throughput and time split after ``warmup_s``, with the run's shape and the learner's memory.
    ``synthetic``: simulated actors; ``learn=False``: the learner takes no SGD step."""
    run_dir = scratch_dir()
    try:
        config = dataclasses.replace(config, out=run_dir)
        validate_train(config, None)
        learner, spec = training.build_learner(config, None)
        learner.learn = learn
        create_run_dir(run_dir)
        write_config(run_dir, config)
        training.train(config, learner, spec, run_dir, quiet=True, program=synthetic or ENV_ACTORS)
        summary = summarize(run_dir / "metrics.jsonl", warmup_s)
    finally:
        shutil.rmtree(run_dir.parent, ignore_errors=True)
    step_bytes = data_bytes(spec) / (config.unroll_length * config.envs_per_actor)
    return {"env": config.env, "algo": config.algo, "runtime": config.runtime, "actors": config.num_actors,
            "synthetic": synthetic is not None, "learning": learner.learn,
            "actors_per_process": 1 if synthetic is None else synthetic.actors_per_process,
            "envs_per_actor": config.envs_per_actor, "frame_dedup": spec.frame_stack > 1, **summary,
            "bytes_per_s": summary["env_steps_per_s"] * step_bytes, "learner_rss_mb": learner_rss_mb()}


def synthetic_actors(count: int | None, per_process: int | None) -> Synthetic | None:
    """The simulated actors ``--synthetic-actors`` (and ``--actors-per-process``) asked for,
    checked; None for real ones."""
    if count is None:
        if per_process is not None:
            raise UserError("--actors-per-process sets how --synthetic-actors share processes; add --synthetic-actors N")
        return None
    if count < 1:
        raise UserError(f"--synthetic-actors must be >= 1, got {count}")
    processes = max(1, (os.cpu_count() or 2) - 1)
    per_process = per_process or -(-count // processes)
    if not 1 <= per_process <= count:
        raise UserError(f"--actors-per-process must be between 1 and --synthetic-actors ({count}), got {per_process}")
    return Synthetic(actors_per_process=per_process)


def summarize(metrics_path: Path, warmup_s: float) -> dict[str, Any]:
    """Throughput and time split over the metrics lines from ``warmup_s`` seconds after data first
    reached the learner (a loaded machine can take long to start the actors)."""
    records = read_metrics(metrics_path)
    flowing = next((r["wall_time_s"] for r in records if r["env_steps"] > 0), None)
    start = None if flowing is None else next(
        (i for i, r in enumerate(records) if r["wall_time_s"] >= flowing + warmup_s), None)
    if start is None or start + 1 >= len(records):
        raise UserError(f"the run logged too few metrics lines {warmup_s:g} s after its first batch"
                        + ("" if flowing is None else f" (which came {flowing:.0f} s in)")
                        + "; give it more --seconds")
    first, steady = records[start], records[start + 1:]
    last = steady[-1]
    summary: dict[str, Any] = {
        "env_steps_per_s": (last["env_steps"] - first["env_steps"]) / (last["wall_time_s"] - first["wall_time_s"]),
        "measured_s": last["wall_time_s"] - first["wall_time_s"],
        "updates_per_s": (last["learner_updates"] - first["learner_updates"]) / (last["wall_time_s"] - first["wall_time_s"]),
        "policy_lag_mean": float(np.mean([r["policy_lag_mean"] for r in steady if r["policy_lag_mean"] is not None])),
    }
    # A line whose interval received no unrolls (such as one written just as the run stops) has no actor split.
    for key in [f"actor_{stage}_fraction" for stage in ACTOR_STAGES] + [f"learner_{stage}_fraction" for stage in LEARNER_STAGES]:
        values = [r[f"time/{key}"] for r in steady if r.get(f"time/{key}") is not None]
        summary[key] = float(np.mean(values)) if values else None
    return summary


def format_summary(summary: dict[str, Any], env: str, algo: str) -> str:
    def share(key: str) -> str:
        return "     -" if summary[key] is None else f"{summary[key]:6.1%}"

    actor = "  ".join(f"{stage} {share(f'actor_{stage}_fraction')}" for stage in ACTOR_STAGES)
    learner = "  ".join(f"{stage} {share(f'learner_{stage}_fraction')}" for stage in LEARNER_STAGES)
    return (f"{algo} on {env}: {summary['env_steps_per_s']:,.0f} env steps/s over {summary['measured_s']:.0f}s "
            f"(policy lag {summary['policy_lag_mean']:.1f})\n"
            f"  actors:  {actor}\n"
            f"  learner: {learner}")


def learner_rss_mb() -> float:
    """This process's resident memory now (Linux; NaN elsewhere)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return float("nan")
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="impactrl-bench-")) / "run"
