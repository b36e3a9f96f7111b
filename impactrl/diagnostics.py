"""The troubleshooting guide as rules over the metrics: live warnings and ``impactrl diagnose``.

Each rule reads the metrics lines so far (oldest first; most rules only the last ``WINDOW_S``
of them) with the run's config and returns a :class:`Finding` or None: what was seen (numbers),
why it matters and what to change (the exact flag). During training the learner checks the
rules at every log interval after a warm-up and reports each finding at most once per
``REPEAT_S``: a line on stderr and a ``diagnostics`` list in that interval's metrics line.
``impactrl diagnose RUN_DIR`` runs them over a finished or running run and lists what was
reported during it.
"""

from __future__ import annotations

import inspect
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

from impactrl.config import TrainConfig, coerce, with_values
from impactrl.envs.tasks import reward_threshold, task_ids
from impactrl.errors import UserError
from impactrl.evaluation import DEFAULT_EPISODE_STEPS, episode_step_limit
from impactrl.metrics import read_metrics

Records = list[dict[str, Any]]

WARMUP_S = 60.0  # live checks start after this much training: start-up transients are not findings
WINDOW_S = 60.0  # most rules read this much of the most recent metrics
REPEAT_S = 300.0  # a rule reports again at most this often
HISTORY = 2000  # lines kept for the rules that read the whole run (entropy, returns)
RETURN_BLOCK = 100  # episodes per mean return when comparing a run's best with its recent returns
FALL_SHARE = 0.25  # a fall of at least this share of the rise before it
FALL_ERRORS = 4  # ... and of at least this many standard errors
# Versions: below this the lag study saw neither the return nor the value error move
# (docs/studies.md#policy-lag-against-value-error-claim-6-of-the-source-documents).
LAG_LIMIT = 20


@dataclass(frozen=True)
class Finding:
    rule: str
    seen: str  # what the metrics show, with numbers
    why: str  # why it matters
    change: str  # what to change, with the exact flags

    def text(self) -> str:
        return f"[{self.rule}] {self.seen}. {self.why}. Try: {self.change}."

    def record(self) -> dict[str, str]:
        return asdict(self)


def recent(records: Records) -> Records:
    """The lines of the last WINDOW_S (at least the last two)."""
    end = records[-1]["wall_time_s"]
    window = [r for r in records if r["wall_time_s"] >= end - WINDOW_S]
    return window if len(window) >= 2 else records[-2:]


def numeric(record: dict[str, Any], key: str) -> bool:
    """Whether ``record`` has a finite number at ``key`` (a non-finite one is written as null)."""
    value = record.get(key)
    return isinstance(value, (int, float)) and math.isfinite(value)


def typical(records: Records, key: str) -> float | None:
    """The median over the lines that have ``key``: a start-up line or a stall does not sway it."""
    values = sorted(r[key] for r in records if numeric(r, key))
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def increase(records: Records, key: str) -> int:
    """How much a cumulative counter grew over the window (0 when it is absent)."""
    values = [r[key] for r in records if key in r]
    return values[-1] - values[0] if len(values) >= 2 else 0


RULES: dict[str, Callable[[Records, TrainConfig, float | None], Finding | None]] = {}


def rule(check: Callable[..., Finding | None]):
    """Register a rule; one that reads the env's solved threshold takes it as ``reward_threshold``."""
    if "reward_threshold" in inspect.signature(check).parameters:
        RULES[check.__name__] = check
    else:
        RULES[check.__name__] = lambda records, config, reward_threshold: check(records, config)
    return check


@rule
def learner_starved(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    wait = typical(records, "time/learner_wait_fraction")
    if wait is None or wait < 0.5:
        return None
    return Finding("learner_starved", f"the learner waited for data {wait:.0%} of the time",
                   "the actors cannot produce unrolls as fast as the learner trains on them, so the learner "
                   "(and its accelerator) idles",
                   f"more actors (--num-actors, now {config.num_actors}, while cores are free: {os.cpu_count()} here), "
                   f"more envs per actor (--envs-per-actor, now {config.envs_per_actor}) to batch inference"
                   + (", --env-backend envpool" if config.env.startswith("ALE/") else "")
                   + "; beyond one machine, --runtime ray")


@rule
def actors_blocked(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    wait = typical(records, "time/actor_wait_fraction")
    learner_wait = typical(records, "time/learner_wait_fraction")
    lag = typical(records, "policy_lag_mean")
    # The learner never idles while the actors do: it is the bottleneck. (PPO's actors wait for
    # new weights by design.) A finding only once the queued unrolls are stale enough to matter:
    # below LAG_LIMIT an actor's idle time costs the run nothing but a core it leaves to the learner.
    if (config.synchronous or wait is None or wait < 0.3 or learner_wait is None or learner_wait > 0.1
            or lag is None or lag < LAG_LIMIT):
        return None
    return Finding("actors_blocked", f"the actors waited for a free slot {wait:.0%} of their time, the learner "
                   f"for data {learner_wait:.0%} of its time, at a policy lag of {lag:.1f} updates",
                   "the learner is the bottleneck: unrolls queue up while the actors idle, and queued unrolls "
                   "grow stale", "a faster learner (--device cuda; --learner-precision bfloat16 on CPUs with "
                   "AMX/AVX-512 BF16), fewer actors (--num-actors), or, for IMPACT, fewer SGD steps per batch "
                   "(--buffer-uses)")


@rule
def policy_lag_high(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    lag = typical(records, "policy_lag_mean")
    off_policy = typical(records, "vtrace/rho_extreme_fraction") or typical(records, "impact/is_weight_clipped_fraction")
    # Lag alone is harmless while the behaviour and learner policies still agree (IMPACT's K
    # steps per batch add versions by design); it matters once the importance weights show it.
    if lag is None or lag <= LAG_LIMIT or off_policy is None or off_policy < 0.05:
        return None
    return Finding("policy_lag_high",
                   f"unrolls were trained on {lag:.1f} versions after the policy that produced them (max "
                   f"{max(r.get('policy_lag_max') or 0 for r in records)}), and {off_policy:.0%} of their "
                   "importance weights are far from 1",
                   "stale data: in docs/results.md's lag study (MinAtar Breakout) a lag of 22 to 47 versions cost "
                   "18-30% of the training return (the value error against real returns did not change)",
                   "fewer unrolls in flight (--rollout-slots, fewer --num-actors), a larger --unrolls-per-batch, "
                   f"or drop stale unrolls with --max-policy-lag {LAG_LIMIT}")


@rule
def importance_weights_exploding(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    extreme = typical(records, "vtrace/rho_extreme_fraction")
    truncated = typical(records, "impact/is_weight_clipped_fraction")
    if extreme is not None and extreme >= 0.2:
        seen = f"{extreme:.0%} of the importance weights π/μ are outside [0.1, 10]"
    elif truncated is not None and truncated >= 0.3:
        seen = f"{truncated:.0%} of the weights μ/π_target exceed ρ = {config.target_worker_clip}"
    else:
        return None
    return Finding("importance_weights_exploding", seen,
                   "the learner's policy is far from the one that acted, so the V-trace targets and policy "
                   "gradient have high variance", "a lower ρ̄ (--clip-rho-threshold, now "
                   f"{config.clip_rho_threshold}), a larger --unrolls-per-batch, or a lower --learning-rate")


@rule
def entropy_collapsed_early(records: Records, config: TrainConfig) -> Finding | None:
    entropies = [(r["env_steps"], r["loss/entropy"]) for r in records if numeric(r, "loss/entropy")]
    if len(entropies) < 2:
        return None
    (_, first), (steps, last) = entropies[0], entropies[-1]
    if first <= 0 or last > 0.1 * first or steps > 0.25 * config.total_env_steps:
        return None
    return Finding("entropy_collapsed_early",
                   f"the policy's entropy fell from {first:.3f} to {last:.3f} nats within "
                   f"{steps / config.total_env_steps:.0%} of the step budget",
                   "the policy became nearly deterministic before it had explored; learning usually stalls "
                   "there", f"a higher --entropy-cost (now {config.entropy_cost}), a lower --learning-rate, and "
                   "check that rewards are clipped or normalised (--reward-clip, --normalize-rewards)")


@rule
def torso_layer_dead(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    worst = [r["torso/dead_units_worst_layer"] for r in records if numeric(r, "torso/dead_units_worst_layer")]
    # Every line of the window: a unit at zero on one batch may still fire on the next.
    if len(worst) < 2 or min(worst) < 1.0:
        return None
    change = f"restart with a lower --learning-rate (now {config.learning_rate})"
    if config.optimizer.startswith("rmsprop"):
        change += f" or a larger --rmsprop-eps (now {config.rmsprop_eps}), which damps RMSProp's steps on small gradients"
    return Finding("torso_layer_dead",
                   f"every unit of one of the torso's ReLU layers was zero on every observation of the learner's "
                   f"batches for the last {len(worst)} metrics lines (first layer: "
                   f"{records[-1].get('torso/dead_units_first_layer', math.nan):.0%} dead)",
                   "the policy and value no longer depend on the observation, and no gradient reaches a dead unit "
                   "to revive it: the run cannot learn from here (dying ReLUs, usually from steps too large for "
                   "the layer)", change)


@rule
def returns_flat(records: Records, config: TrainConfig, reward_threshold: float | None = None) -> Finding | None:
    # The best block of RETURN_BLOCK episodes in the first two thirds of the run against the last
    # third: a few lines' means were the maxima of a handful of games each (Pong), so a run still
    # improving read as flat.
    blocks = episode_blocks(records, RETURN_BLOCK)
    if len(blocks) < 6 or records[-1]["env_steps"] < 0.3 * config.total_env_steps:
        return None
    split = 2 * len(blocks) // 3
    best_before = max(block.mean for block in blocks[:split])
    best_after = max(block.mean for block in blocks[split:])
    if reward_threshold is not None and best_before >= reward_threshold:
        return None  # solved, not stuck
    if best_after > best_before + 0.02 * max(abs(best_before), 1.0):
        return None
    return Finding("returns_flat",
                   f"the mean return has not improved over the last {records[-1]['env_steps'] - blocks[split - 1].env_steps:,} "
                   f"env steps (best {best_before:.2f} before, {best_after:.2f} since, means of {RETURN_BLOCK} episodes)",
                   "learning has stalled: credit may not reach far enough back, or exploration stopped",
                   f"longer unrolls (--unroll-length {2 * config.unroll_length}, now {config.unroll_length}), "
                   f"a higher --entropy-cost (now {config.entropy_cost}), or another --learning-rate")


@dataclass(frozen=True)
class ReturnBlock:
    """The episodes of consecutive metrics lines: how many, their mean return and its standard error."""

    env_steps: int  # at the block's last line
    episodes: int
    mean: float
    standard_error: float


def episode_blocks(records: Records, episodes: int) -> list[ReturnBlock]:
    """Consecutive lines that together hold at least ``episodes`` episodes, counted back from the
    newest line (fewer left over at the start are left out), each line's mean and standard
    deviation pooled."""
    blocks: list[ReturnBlock] = []
    lines: list[tuple[int, float, float]] = []
    count = 0
    for record in reversed(records):
        ended, mean, std = record.get("episodes") or 0, record.get("episode_return_mean"), record.get("episode_return_std")
        if not ended or mean is None or std is None:
            continue
        if not lines:
            end = record["env_steps"]
        lines.append((ended, mean, std))
        count += ended
        if count >= episodes:
            pooled_mean = sum(n * m for n, m, _ in lines) / count
            variance = sum(n * (s * s + (m - pooled_mean) ** 2) for n, m, s in lines) / count
            blocks.append(ReturnBlock(end, count, pooled_mean, math.sqrt(variance / count)))
            lines, count = [], 0
    return blocks[::-1]


@rule
def returns_fell(records: Records, config: TrainConfig, reward_threshold: float | None = None) -> Finding | None:
    # The troubleshooting guide's "unstable": the return rose, then fell back. Blocks of
    # RETURN_BLOCK episodes; the rise to the best block and the fall from it must both exceed
    # FALL_ERRORS standard errors of the difference, so that noise is no finding, and the fall
    # a FALL_SHARE of the rise. Several tasks' returns have different scales: not compared.
    blocks = episode_blocks(records, RETURN_BLOCK)
    if len(blocks) < 3 or len(task_ids(config.env)) > 1:
        return None
    start, recent = blocks[0], blocks[-1]
    best = max(blocks[:-1], key=lambda block: block.mean)
    rise, fall = best.mean - start.mean, best.mean - recent.mean
    if ((reward_threshold is not None and recent.mean >= reward_threshold)
            or rise <= FALL_ERRORS * math.hypot(best.standard_error, start.standard_error)
            or fall <= FALL_ERRORS * math.hypot(best.standard_error, recent.standard_error)
            or fall < FALL_SHARE * rise):
        return None
    if config.synchronous:
        steadier = (f"a smaller --clip-param (now {config.clip_param}), fewer --update-epochs (now "
                    f"{config.update_epochs})")
    elif config.algo == "impact":
        steadier = (f"a smaller --clip-param (now {config.clip_param}), fewer --buffer-uses (now "
                    f"{config.buffer_uses}), a larger --unrolls-per-batch (now {config.unrolls_per_batch})")
    else:
        steadier = (f"a lower ρ̄ (--clip-rho-threshold, now {config.clip_rho_threshold}), a larger --unrolls-per-batch "
                    f"(now {config.unrolls_per_batch})")
    return Finding("returns_fell",
                   f"the mean return rose from {start.mean:.2f} to {best.mean:.2f} (the {best.episodes} episodes "
                   f"to {best.env_steps:,} env steps) and fell back to {recent.mean:.2f} (the last "
                   f"{recent.episodes})",
                   "the updates have become unstable: the policy moves too far on noisy or stale data",
                   f"{steadier}, or a lower --learning-rate (now {config.learning_rate})")


@rule
def rewards_unclipped(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    largest = typical(records, "reward/batch_abs_max")
    if config.reward_clip != "none" or config.normalize_rewards or largest is None or largest <= 10:
        return None
    return Finding("rewards_unclipped", f"rewards reach |r| = {largest:.3g} per batch on average, unclipped and "
                   "unnormalised", "large rewards give large, high-variance gradients that the gradient clip then "
                   "distorts", "--reward-clip abs_one (the Atari practice) or --normalize-rewards")


@rule
def non_finite_updates(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    skipped = increase(records, "updates_skipped")
    if skipped < 1:
        return None
    return Finding("non_finite_updates", f"{skipped} learner updates had a NaN or Inf loss or gradient and were "
                   "skipped", f"the run stops after --max-skipped-updates {config.max_skipped_updates} in a row",
                   f"a lower --learning-rate (now {config.learning_rate}) or --grad-norm-clip (now "
                   f"{config.grad_norm_clip}), scaled rewards (--reward-clip abs_one, --normalize-rewards), and "
                   "check the env for NaN observations or rewards")


@rule
def actors_restarting(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    restarts, env_errors = increase(records, "actor_restarts"), increase(records, "env_errors")
    if restarts < 2 and env_errors < 5:
        return None
    return Finding("actors_restarting", f"{restarts} actor restarts and {env_errors} env errors in "
                   f"{records[-1]['wall_time_s'] - records[0]['wall_time_s']:.0f} s",
                   "each restart or rebuilt env drops an unroll and restarts episodes; the run stops once an "
                   f"actor exceeds --max-actor-restarts {config.max_actor_restarts}",
                   "read the tracebacks on stderr (the env or its wrappers raise); an actor killed without one may "
                   "be out of memory (fewer --num-actors or --envs-per-actor)")


@rule
def throughput_below_env_speed(records: Records, config: TrainConfig) -> Finding | None:
    records = recent(records)
    env_alone = typical(records, "time/actor_env_steps_per_s")
    achieved = typical(records, "env_steps_per_s")
    inference = typical(records, "time/actor_inference_fraction")
    if env_alone is None or achieved is None or achieved >= 0.1 * env_alone * config.num_actors:
        return None
    return Finding("throughput_below_env_speed",
                   f"{achieved:,.0f} env steps/s, while one actor's envs alone step at {env_alone:,.0f}/s "
                   f"(actors spend {inference or 0:.0%} of their time on inference)",
                   "the envs are not the limit: inference, waiting or the learner is",
                   f"more envs per actor (--envs-per-actor, now {config.envs_per_actor}) to batch inference; "
                   "`impactrl bench` shows where the time goes")


@rule
def episodes_not_ending(records: Records, config: TrainConfig) -> Finding | None:
    # An episode lasts at most its env's time limit: once every env has stepped more than that on
    # average since an episode last ended, some env went past it without ending one.
    ended = [r for r in records if r.get("episodes")]
    steps = records[-1]["env_steps"] - (ended[-1] if ended else records[0])["env_steps"]
    if not steps:
        return None
    per_env = steps / (config.num_actors * config.envs_per_actor)
    limits = [episode_step_limit(env_id, config) for env_id in task_ids(config.env)]
    longest = max(limit or DEFAULT_EPISODE_STEPS for limit in limits)
    if per_env <= longest:
        return None
    limit = (f"{config.env} has no time limit, and {longest:,} steps is eval's cap" if None in limits
             else f"an episode of {config.env} lasts at most {longest:,} steps")
    return Finding("episodes_not_ending",
                   f"no episode ended in the last {steps:,} env steps ({per_env:,.0f} per env; {limit})",
                   "without episode ends there are no returns to see learning by (the progress line shows none, "
                   "--stop-at-return never stops the run), and an episode that never ends is usually an env whose "
                   "step() never returns terminated or truncated",
                   "check that the env's step() returns terminated (or truncated) where an episode should end; for "
                   "a task with no end of its own, set a time limit with --max-episode-steps N (Gymnasium's "
                   "TimeLimit: each episode truncated at N steps)")


def diagnose(records: Records, config: TrainConfig, reward_threshold: float | None = None) -> list[Finding]:
    """Every rule over the metrics lines ``records``; the findings in rule order."""
    found = []
    for check in RULES.values():
        finding = check(records, config, reward_threshold)
        if finding is not None:
            found.append(finding)
    return found


class LiveDiagnostics:
    """The rules during training, after WARMUP_S, each reported at most once per REPEAT_S."""

    def __init__(self, config: TrainConfig, reward_threshold: float | None):
        self.config = config
        self.reward_threshold = reward_threshold
        self.history: Records = []
        self.last_reported: dict[str, float] = {}

    def check(self, record: dict[str, Any]) -> list[Finding]:
        self.history = [*self.history[-(HISTORY - 1):], record]
        now = record["wall_time_s"]
        if now < WARMUP_S or len(self.history) < 2:
            return []
        fresh = []
        for finding in diagnose(self.history, self.config, self.reward_threshold):
            if now - self.last_reported.get(finding.rule, -math.inf) >= REPEAT_S:
                self.last_reported[finding.rule] = now
                fresh.append(finding)
        return fresh


def readable(record: Any) -> bool:
    """A metrics line the rules can read: an object with the env steps and time every line has."""
    return isinstance(record, dict) and numeric(record, "env_steps") and numeric(record, "wall_time_s")


def read_run(run_dir: Path) -> tuple[TrainConfig, Records, int]:
    """A run directory's config, its readable metrics lines and how many others were skipped;
    UserError when it has none."""
    run_dir = Path(run_dir)
    try:
        values = yaml.safe_load((run_dir / "config.yaml").read_text())
        lines = read_metrics(run_dir / "metrics.jsonl")
    except OSError as error:
        raise UserError(f"{run_dir} is not a run directory with metrics ({error.strerror}: {error.filename})") from None
    records = [record for record in lines if readable(record)]
    if not records:
        raise UserError(f"{run_dir}/metrics.jsonl holds no metrics yet" if not lines else
                        f"{run_dir}/metrics.jsonl holds no metrics lines with env_steps and wall_time_s")
    return with_values(TrainConfig(), coerce(values, "config.yaml")), records, len(lines) - len(records)


def report(run_dir: Path) -> str:
    """What ``impactrl diagnose`` prints: the rules over the run's last minute, then its live warnings."""
    config, records, skipped = read_run(run_dir)
    last = records[-1]
    skipped_note = f", {skipped} more without env_steps and wall_time_s skipped" if skipped else ""
    lines = [f"{run_dir}: {config.algo} on {config.env}, {last['env_steps']:,} env steps in {last['wall_time_s']:.0f} s "
             f"({len(records)} metrics lines{skipped_note})"]
    findings = diagnose(records, config, reward_threshold(config.env))
    lines.append("At the end of the run:" if findings else "At the end of the run: nothing to report.")
    lines += [f"  {finding.text()}" for finding in findings]
    logged = Counter(d["rule"] for r in records for d in r.get("diagnostics", []))
    if logged:
        lines.append("Reported during the run: " + ", ".join(f"{rule} ({count}x)" for rule, count in logged.items()))
    return "\n".join(lines)
