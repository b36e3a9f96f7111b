"""Population-based training on Ray Tune: ``impactrl tune`` and ``impactrl.tune``.

A population of impactrl runs (trials) trains under Ray Tune, each on the node Tune places it on,
with PBT (exploit a better trial's checkpoint, explore its settings), PB2 (the same, with the
explore step from a Gaussian-process bandit) or a plain random search (the same starts, no
exploit). Modules: ``space`` (the explored ranges and starting values), ``trial`` (one run as a
Tune ``Trainable``), ``schedulers`` (PBT and PB2, writing pbt.jsonl), ``record`` (pbt.jsonl,
lineage and summary.json read back, without Ray), ``progress`` (the terminal),
``experiment`` (the plan, its checks, the Tuner). docs/tune.md says how it works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from impactrl.config import TrainConfig
from impactrl.population.experiment import TuneResult


def tune(env: str | None = None, algo: str | None = None, *, explore: Sequence[str] = (), population: int = 4,
         initial: Sequence[str] = (), search: str = "pbt", interval_env_steps: int | None = None,
         out: str | Path | None = None, resume: str | Path | None = None, ray_address: str | None = None,
         cpus_per_trial: float | None = None, quantile_fraction: float = 0.25, max_failures: int = 2,
         quiet: bool = False, config: TrainConfig | None = None, **settings) -> TuneResult:
    """Train a population like ``impactrl tune --env ENV --algo ALGO --explore NAME=LOW..HIGH[:log] ...``.

    ``explore``: the settings to explore (``"learning-rate=1e-4..3e-3:log"``); ``initial``: each
    trial's starting value of some of them (``"entropy-cost=0.001,0.01,0.03,0.1"``), the rest drawn
    from their ranges; ``interval_env_steps``: how often trials are compared (default a twentieth of
    the budget); ``out``: the experiment directory; ``resume``: continue the experiment in that
    directory instead; ``settings``: any ``impactrl train`` setting, for every trial; ``config``: a
    whole ``TrainConfig`` instead of ``env``, ``algo`` and settings (``impactrl tune`` passes the one its
    train flags resolved to)."""
    from impactrl.api import resolved
    from impactrl.errors import UserError
    from impactrl.population.experiment import plan_population, run_population

    try:
        import ray.tune  # noqa: F401
        if search == "pb2":
            import sklearn  # noqa: F401
    except ImportError as error:
        raise UserError(f'impactrl tune needs Ray Tune{" and scikit-learn" if search == "pb2" else ""} ({error}): '
                        'pip install -e ".[tune]"') from None

    if resume is not None:
        if env is not None or algo is not None or settings or explore or initial or config is not None:
            raise UserError("impactrl tune --resume continues an experiment as it was asked; give no other settings")
        return run_population(None, Path(resume), resume=True, ray_address=ray_address, quiet=quiet)
    if config is not None:
        if env is not None or algo is not None or settings:
            raise UserError("impactrl.tune: config is a whole TrainConfig; give it alone, or env, algo and settings")
        base = config
    elif env is None:
        raise UserError('impactrl.tune: env is required (a Gymnasium id, e.g. env="MinAtar/Breakout-v1")')
    else:
        base, _ = resolved(env, algo, None, None, settings)
    plan = plan_population(base, population=population, explore=explore, initial=initial, search=search,
                           interval_env_steps=interval_env_steps, cpus_per_trial=cpus_per_trial,
                           quantile_fraction=quantile_fraction, max_failures=max_failures)
    experiment = Path(out) if out is not None else Path("runs") / f"tune-{base.env.replace('/', '_')}-{base.algo}"
    return run_population(plan, experiment.absolute(), resume=False, ray_address=ray_address, quiet=quiet)


__all__ = ["TuneResult", "tune"]
