"""Training configuration: one typed, frozen dataclass whose fields are the CLI flags.

Resolution order (later wins): field defaults < the presets (the env family's, the algorithm's,
the algorithm's for the family: see ``preset_files``) < ``--config FILE.yaml`` < flags on the
command line. ``RUN_DIR/config.yaml`` holds the result, and ``--resume`` starts
from it. Values derived from others (unrolls per slot, number of slots) are properties, never
fields rewritten after parsing.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from impactrl.errors import UserError

EnvBackend = Literal["gymnasium", "envpool"]


@dataclass(frozen=True)
class TrainConfig:
    """Train an agent with IMPALA, IMPACT or PPO on many actor processes and one learner."""

    # --- what to run --------------------------------------------------------------------------
    algo: Literal["impala", "impact", "ppo"] = "impala"
    """Algorithm: impala (V-trace actor-critic), impact (IMPALA + target network + circular buffer), ppo (synchronous)."""
    env: str = "CartPole-v1"
    """Gymnasium id (CartPole-v1, MinAtar/Breakout-v1, ALE/Pong-v5, ...), or several tasks for one agent:
    ids separated by commas (one env family) or a suite (minatar = the five MinAtar games)."""
    task_weights: tuple[float, ...] = ()
    """Several tasks: each task's share of the envs, one weight per task in --env's order (default: round-robin)."""
    total_env_steps: int = 500_000
    """Stop after this many environment steps (agent steps; an Atari step is frame_skip frames)."""
    max_wall_time_s: float | None = None
    """Also stop after this many seconds of training in this invocation (None = no limit)."""
    stop_at_return: float | None = None
    """Also stop once the mean training return of the last 100 episodes reaches this (one task only)."""
    seed: int = 1
    """Seed for the learner's initialisation and, offset per actor and env, for the environments."""
    out: Path | None = None
    """Run directory for metrics.jsonl, tb/, config.yaml and checkpoints/ (default: runs/ENV-ALGO-seedS)."""
    runtime: Literal["local", "ray"] = "local"
    """Where actors and learner run: local = processes and shared memory on this machine; ray = Ray
    actors on a Ray cluster (pip install -e ".[ray]"), the learner in this process (docs/ray.md)."""
    ray_address: str | None = None
    """Ray runtime: the cluster to join, HOST:PORT of its head (or auto); None = start a local Ray
    instance for this run and stop it at the end. A joined cluster is left running."""
    ray_actor_cpus: float = 1.0
    """Ray runtime: CPUs each actor asks Ray for."""
    ray_actor_resources: tuple[str, ...] = ()
    """Ray runtime: other resources each actor asks Ray for, as NAME=AMOUNT (e.g. actor=1 to keep
    actors on the nodes started with --resources '{"actor": 64}')."""
    publish_interval: int = 1
    """Publish the weights to the actors at most every N learner updates (saves copies on large
    models and GPU learners; PPO's actors still get every version they wait for)."""
    weight_delta: Literal["off", "lossless", "lossy"] = "off"
    """Ray runtime: broadcast weights as compressed differences against the previous publication
    (a full copy every 32): lossless = bit-exact (XOR, zlib); lossy = each weight an actor holds
    stays within weight_delta_bound of the learner's (quantised, zlib)."""
    weight_delta_bound: float = 1e-4
    """Ray runtime, weight_delta lossy: the largest absolute difference between an actor's weight and the learner's."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Learner device; actors always run on the CPU."""

    learner_threads: int = 0
    """Intra-op threads for the learner's PyTorch ops; 0 = the cores the actors leave free (at least 1)."""

    # --- actors -------------------------------------------------------------------------------
    num_actors: int = 2
    """Actor processes, each stepping envs_per_actor environments with batched inference."""
    envs_per_actor: int = 8
    """Environments stepped in lockstep by one actor process."""
    unroll_length: int = 20
    """Steps per unroll (T); each unroll also carries the next observation for bootstrapping."""
    batch_size: int = 32
    """IMPALA, IMPACT: unrolls (one per environment) per learner batch; a multiple of envs_per_actor.
    PPO (synchronous) always takes one from every env: num_actors * envs_per_actor."""
    queue_slots: int = 0
    """Shared-memory rollout slots (one actor unroll each); 0 = 2 * num_actors + 2 * batch slots."""
    max_policy_lag: int | None = None
    """Drop unrolls the learner would train on more than this many versions after the policy that
    produced them (counted as unrolls_dropped); None = keep all."""

    # --- environment --------------------------------------------------------------------------
    env_backend: EnvBackend = "gymnasium"
    """How actors step their envs: gymnasium (any id, Python wrappers) or envpool (C++; Atari and
    classic-control ids; pip install envpool). Evaluation always uses gymnasium."""
    frame_skip: int = 4
    """Atari: action repeat, max-pooling the last two frames."""
    frame_stack: int = 4
    """Atari: frames stacked into one observation."""
    frame_dedup: bool = True
    """Atari: unrolls carry each frame once and the learner rebuilds the stacks (about 3x less
    rollout memory and traffic); --no-frame-dedup carries whole stacks."""
    noop_max: int = 30
    """Atari: at most this many random no-ops after a reset."""
    sticky_action_prob: float | None = None
    """Atari: probability of repeating the previous action (None = the env id's default)."""
    episodic_life: bool = True
    """Atari: a lost life ends the training episode (evaluation always plays whole games)."""
    max_episode_steps: int | None = None
    """Truncate episodes after this many steps (None = the env's own limit)."""
    image_layout: Literal["auto", "chw", "hwc"] = "auto"
    """3-D Box observations of other envs than Atari and MinAtar: chw (channels first, as the CNNs
    take them), hwc (height x width x channels: transposed), auto (hwc when the last size is a
    channel count (<= 4, or at most half the others) and the first is not, chw the other way round;
    a shape that says neither is refused)."""

    # --- model --------------------------------------------------------------------------------
    torso: Literal["auto", "mlp", "minatar", "shallow_cnn", "resnet"] = "auto"
    """Feature extractor: auto picks mlp (vectors), minatar (small grids), shallow_cnn (Atari)."""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the MLP torso."""
    use_lstm: bool = False
    """Add an LSTM core fed with the previous action and clipped reward."""
    lstm_size: int = 256
    """Hidden units of the LSTM core."""
    separate_value_network: bool = False
    """Give the value function its own torso (CleanRL's MuJoCo PPO network); not with the LSTM."""
    normalize_observations: bool = False
    """Normalise vector observations by running mean and std; the statistics travel with the weights."""
    popart: bool = False
    """IMPALA, IMPACT: PopArt (Hessel et al. 2019): value targets normalised per task by running
    statistics, with the value head rewritten to preserve its outputs; lets tasks with different
    reward scales train together, with --reward-clip none."""
    popart_beta: float = 3e-4
    """PopArt: step size of the statistics' moving averages (per learner update)."""
    normalize_rewards: bool = False
    """Scale rewards by the running std of the discounted return, per env, clipped to +-10 (CleanRL)."""
    squash_actions: bool = False
    """Continuous actions: tanh-squash the Gaussian into the action bounds (default: sample, then clip)."""
    log_std_init: float = 0.0
    """Continuous actions: initial log standard deviation of the Gaussian."""

    # --- loss (Espeholt et al. 2018) --------------------------------------------------------------
    discount: float = 0.99
    """Discount factor gamma."""
    baseline_cost: float = 0.5
    """Weight of the value loss."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    reward_clip: Literal["none", "abs_one"] = "none"
    """Reward transform in the loss: abs_one clips to [-1, 1] (returns are logged unclipped)."""
    clip_rho_threshold: float | None = 1.0
    """V-trace rho-bar: clips the importance weight in the TD error (None = no clipping)."""
    clip_pg_rho_threshold: float | None = 1.0
    """V-trace rho-bar for the policy-gradient advantage (None = no clipping)."""
    clip_c_threshold: float | None = 1.0
    """V-trace c-bar: clips the trace coefficients (None = no clipping)."""
    vtrace_lambda: float = 1.0
    """V-trace lambda: c_t = lambda * min(c-bar, rho_t)."""

    # --- IMPACT (Luo et al. 2020) ------------------------------------------------------------------
    buffer_batches: int = 1
    """IMPACT circular buffer: batches held (N)."""
    buffer_uses: int = 2
    """IMPACT circular buffer: SGD steps taken on each batch (K)."""
    buffer_fetch: Literal["free", "ready"] = "free"
    """IMPACT: when the learner takes a batch from the actors: free = only while the buffer has a free place
    (every batch gets its K steps; actors wait when the learner is slower); ready = whenever one is ready,
    evicting the oldest batch with its steps left, and training on the held batches while none is."""
    target_update_interval: int = 0
    """IMPACT: learner updates between target-network refreshes (0 = 2 * N * K)."""
    target_update_tau: float = 1.0
    """IMPACT: 1 = hard copy; < 1 = Polyak averaging with this weight."""
    target_scoring: Literal["use", "insert"] = "use"
    """IMPACT: score a batch with the target network at each use (RLlib) or once at insertion (the paper)."""
    use_target_network: bool = True
    """IMPACT ablation: without it the ratio is taken against the behaviour policy."""
    target_worker_clip: float | None = 2.0
    """IMPACT: rho in min(mu / pi_target, rho), the truncated IS weight (None = no truncation, an ablation)."""
    clip_param: float = 0.4
    """IMPACT and PPO: epsilon of the clipped surrogate."""
    use_kl_loss: bool = False
    """IMPACT: add KL(pi_target || pi) with an adaptive coefficient."""
    kl_coeff: float = 1.0
    """IMPACT: initial KL coefficient."""
    kl_target: float = 0.01
    """IMPACT: the KL the adaptive coefficient aims for."""

    # --- PPO (Schulman et al. 2017, CleanRL's defaults) -------------------------------------------
    gae_lambda: float = 0.95
    """PPO: GAE lambda."""
    update_epochs: int = 10
    """PPO: passes over each batch."""
    num_minibatches: int = 32
    """PPO: minibatches per pass."""
    normalize_advantages: bool = True
    """PPO and IMPACT: normalise advantages per (mini)batch (IMPACT's preset turns it off, as RLlib)."""
    clip_value_loss: bool = True
    """PPO: clip the value update around the old value estimate."""

    # --- optimiser ----------------------------------------------------------------------------
    optimizer: Literal["rmsprop", "rmsprop_tf", "adam"] = "rmsprop"
    """RMSProp in PyTorch's form, RMSProp in TensorFlow 1's (the IMPALA paper's: ε under the root, mean
    square from 1; docs/algorithms.md#rmsprop-tensorflows-form-and-pytorchs) or Adam (IMPACT, PPO)."""
    learning_rate: float = 6e-4
    """Learning rate."""
    rmsprop_alpha: float = 0.99
    """RMSProp smoothing constant (decay)."""
    rmsprop_eps: float = 0.01
    """RMSProp epsilon: added to the root mean square with rmsprop, under the root with rmsprop_tf (the
    IMPALA paper's 0.01 there is about 0.1 in PyTorch's form)."""
    rmsprop_momentum: float = 0.0
    """RMSProp momentum."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    lr_decay: bool = True
    """Anneal the learning rate linearly to 0 over total_env_steps, or over max_wall_time_s when that
    budget ends first (then the schedule depends on the machine's speed)."""
    grad_norm_clip: float = 40.0
    """Clip the global gradient norm to this value."""
    learner_precision: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: autocast the learner's convolutions and matmuls to bfloat16 (losses, V-trace and
    optimiser stay float32). 1.6-1.9x faster learner steps on CPUs with AMX / AVX-512 BF16 and on
    recent GPUs; slower on CPUs without them. Actors always infer in float32."""

    # --- logging and checkpoints --------------------------------------------------------------
    wandb_project: str | None = None
    """Also log the metrics to Weights & Biases under this project (pip install -e ".[wandb]"); offline
    unless WANDB_MODE says otherwise: files in RUN_DIR/wandb, uploaded later with `wandb sync`."""
    log_interval_s: float = 5.0
    """Seconds between metrics lines (terminal, metrics.jsonl, TensorBoard)."""
    checkpoint_interval_s: float = 60.0
    """Seconds between checkpoints (what a hard kill of the learner can lose); one is always written at the end."""
    keep_checkpoints: int = 3
    """How many checkpoints to keep on disk (a corrupt newest one falls back to the one before)."""

    # --- faults -------------------------------------------------------------------------------
    max_actor_restarts: int = 5
    """Restarts of one actor (after it died or hung) within actor_restart_window_s before the run stops (0 = stop at once)."""
    actor_restart_window_s: float = 600.0
    """Seconds over which max_actor_restarts is counted."""
    actor_stall_timeout_s: float = 60.0
    """An actor without a heartbeat for this long is killed and restarted; the learner reports waiting this long for data."""
    max_skipped_updates: int = 10
    """Updates in a row with a non-finite loss or gradient (each skipped) before the run stops."""

    # --- derived values -------------------------------------------------------------------------
    @property
    def synchronous(self) -> bool:
        """PPO: actors wait for the weights trained on their last unroll before the next one."""
        return self.algo == "ppo"

    @property
    def unrolls_per_batch(self) -> int:
        """Unrolls (one env's T steps each) in a learner batch; PPO's is every env's."""
        return self.num_actors * self.envs_per_actor if self.synchronous else self.batch_size

    @property
    def slots_per_batch(self) -> int:
        """Actor unrolls (shared-memory slots) that make one learner batch."""
        return self.unrolls_per_batch // self.envs_per_actor

    @property
    def target_update_period(self) -> int:
        """IMPACT: learner updates between target refreshes (the paper's n * N * K with n = 2)."""
        return self.target_update_interval or 2 * self.buffer_batches * self.buffer_uses

    @property
    def num_slots(self) -> int:
        """Shared-memory rollout slots: enough for every actor to write while a batch trains."""
        return self.queue_slots or 2 * self.num_actors + 2 * self.slots_per_batch

    @property
    def steps_per_batch(self) -> int:
        return self.unrolls_per_batch * self.unroll_length

    def run_dir(self) -> Path:
        return self.out if self.out is not None else Path("runs") / f"{self.env.replace('/', '_')}-{self.algo}-seed{self.seed}"


def problems(config: TrainConfig) -> list[str]:
    """Every problem with a config's values, each as a short phrase (empty when all is well)."""
    found: list[str] = []
    # The env's own settings (frame_skip, frame_stack, noop_max, sticky_action_prob,
    # max_episode_steps) are checked by EnvOptions.problems, once.
    positive = ("total_env_steps", "num_actors", "envs_per_actor", "unroll_length", "batch_size",
                "lstm_size", "keep_checkpoints", "buffer_batches", "buffer_uses",
                "update_epochs", "num_minibatches", "max_skipped_updates", "publish_interval")
    for name in positive:
        value = getattr(config, name)
        if value < 1:
            found.append(f"{name} must be >= 1, got {value}")
    if any(size < 1 for size in config.hidden_sizes) or not config.hidden_sizes:
        found.append(f"hidden_sizes must be positive integers, got {list(config.hidden_sizes)}")
    if (not config.synchronous and config.batch_size >= 1 and config.envs_per_actor >= 1
            and config.batch_size % config.envs_per_actor):
        found.append(f"batch_size={config.batch_size} must be a multiple of envs_per_actor={config.envs_per_actor}")
    if config.total_env_steps >= 1 and config.steps_per_batch > config.total_env_steps:
        found.append(f"total_env_steps={config.total_env_steps:,} is less than one batch ({config.unrolls_per_batch} unrolls "
                     f"of {config.unroll_length} steps = {config.steps_per_batch:,}): raise --total-env-steps or lower "
                     "--unroll-length or the batch")
    if config.algo == "ppo" and config.num_minibatches > config.steps_per_batch:
        found.append(f"num_minibatches={config.num_minibatches} exceeds the {config.steps_per_batch} steps of a batch")
    if config.target_update_interval < 0:
        found.append(f"target_update_interval must be >= 0, got {config.target_update_interval}")
    for name in ("target_update_tau", "gae_lambda"):
        if not 0.0 < getattr(config, name) <= 1.0:
            found.append(f"{name} must be in (0, 1], got {getattr(config, name)}")
    for name in ("clip_param", "kl_coeff", "kl_target", "adam_eps"):
        if not getattr(config, name) > 0:
            found.append(f"{name} must be > 0, got {getattr(config, name)}")
    if config.target_worker_clip is not None and not config.target_worker_clip > 0:
        found.append(f"target_worker_clip must be > 0 or None, got {config.target_worker_clip}")
    if config.algo == "ppo" and config.use_lstm:
        found.append("ppo with use_lstm is not supported yet (its minibatches are single steps); use impala or impact")
    if config.separate_value_network and config.use_lstm:
        found.append("separate_value_network cannot be combined with use_lstm")
    if config.learner_threads < 0:
        found.append(f"learner_threads must be >= 0, got {config.learner_threads}")
    if config.max_policy_lag is not None and config.max_policy_lag < 0:
        found.append(f"max_policy_lag must be >= 0 or None, got {config.max_policy_lag}")
    if config.queue_slots < 0:
        found.append(f"queue_slots must be >= 0, got {config.queue_slots}")
    elif config.queue_slots and config.slots_per_batch >= 1 and config.queue_slots < max(config.slots_per_batch + 1,
                                                                                          config.num_actors):
        found.append(f"queue_slots={config.queue_slots} must be >= {max(config.slots_per_batch + 1, config.num_actors)} "
                     "(one batch plus one slot an actor can write, and one slot per actor)")
    if config.max_actor_restarts < 0:
        found.append(f"max_actor_restarts must be >= 0, got {config.max_actor_restarts}")
    if not 0.0 <= config.discount <= 1.0:
        found.append(f"discount must be in [0, 1], got {config.discount}")
    if not 0.0 <= config.vtrace_lambda <= 1.0:
        found.append(f"vtrace_lambda must be in [0, 1], got {config.vtrace_lambda}")
    for name in ("clip_rho_threshold", "clip_pg_rho_threshold", "clip_c_threshold"):
        value = getattr(config, name)
        if value is not None and not value > 0:
            found.append(f"{name} must be > 0 or None, got {value}")
    for name in ("baseline_cost", "entropy_cost", "rmsprop_momentum"):
        if getattr(config, name) < 0:
            found.append(f"{name} must be >= 0, got {getattr(config, name)}")
    for name in ("learning_rate", "rmsprop_eps", "grad_norm_clip", "log_interval_s", "checkpoint_interval_s",
                 "actor_restart_window_s", "actor_stall_timeout_s"):
        value = getattr(config, name)
        if not (value > 0 and math.isfinite(value)):
            found.append(f"{name} must be > 0, got {value}")
    if not 0.0 < config.rmsprop_alpha < 1.0:
        found.append(f"rmsprop_alpha must be in (0, 1), got {config.rmsprop_alpha}")
    if config.popart and config.algo == "ppo":
        found.append("popart needs the V-trace learners: use --algo impala or impact")
    if not 0.0 < config.popart_beta <= 1.0:
        found.append(f"popart_beta must be in (0, 1], got {config.popart_beta}")
    if any(not (weight > 0 and math.isfinite(weight)) for weight in config.task_weights):
        found.append(f"task_weights must be positive numbers, got {list(config.task_weights)}")
    if config.max_wall_time_s is not None and not config.max_wall_time_s > 0:
        found.append(f"max_wall_time_s must be > 0 or None, got {config.max_wall_time_s}")
    if config.stop_at_return is not None and not math.isfinite(config.stop_at_return):
        found.append(f"stop_at_return must be a finite number or None, got {config.stop_at_return}")
    found += ray_problems(config)
    return found


def ray_problems(config: TrainConfig) -> list[str]:
    """The Ray settings' values; whether the cluster can hold the actors is checked when joining it."""
    found = []
    if config.runtime != "ray":
        if config.ray_address is not None or config.ray_actor_resources:
            found.append("--ray-address and --ray-actor-resources need --runtime ray")
        return found
    address = config.ray_address
    if address is not None and address != "auto":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            found.append(f"ray_address must be HOST:PORT (the head node's GCS address, e.g. 10.0.0.1:6379) or "
                         f"auto, got {address!r}")
    if not (config.ray_actor_cpus >= 0 and math.isfinite(config.ray_actor_cpus)):
        found.append(f"ray_actor_cpus must be >= 0, got {config.ray_actor_cpus}")
    if not (config.weight_delta_bound > 0 and math.isfinite(config.weight_delta_bound)):
        found.append(f"weight_delta_bound must be > 0, got {config.weight_delta_bound}")
    for item in config.ray_actor_resources:
        name, _, amount = item.partition("=")
        try:
            valid = bool(name) and float(amount) > 0 and name not in ("CPU", "GPU")
        except ValueError:
            valid = False
        if not valid:
            found.append(f"ray_actor_resources: {item!r} is not NAME=AMOUNT with an amount > 0 "
                         "(CPUs are set with --ray-actor-cpus; actors need no GPU)")
    return found


def ray_actor_resources(config: TrainConfig) -> dict[str, float]:
    """``--ray-actor-resources`` as Ray takes them (validated by ``problems``)."""
    return {name: float(amount) for name, _, amount in (item.partition("=") for item in config.ray_actor_resources)}


# Settings only some algorithms, env families or optimisers read.
READ_ONLY_BY = {
    "IMPACT": ({"impact"}, ("buffer_batches", "buffer_uses", "buffer_fetch", "target_update_interval", "target_update_tau",
                            "target_scoring", "use_target_network", "target_worker_clip", "use_kl_loss", "kl_coeff",
                            "kl_target")),
    "PPO": ({"ppo"}, ("gae_lambda", "update_epochs", "num_minibatches", "clip_value_loss")),
    "IMPACT and PPO": ({"impact", "ppo"}, ("clip_param", "normalize_advantages")),
    "IMPALA and IMPACT (V-trace)": ({"impala", "impact"}, ("clip_rho_threshold", "clip_pg_rho_threshold",
                                                           "clip_c_threshold", "vtrace_lambda", "batch_size",
                                                           "max_policy_lag", "popart_beta")),
}
ATARI_SETTINGS = ("frame_skip", "frame_stack", "noop_max", "sticky_action_prob", "episodic_life", "frame_dedup")
RMSPROP_SETTINGS = ("rmsprop_alpha", "rmsprop_eps", "rmsprop_momentum")
OPTIMIZER_SETTINGS = {"rmsprop": RMSPROP_SETTINGS, "rmsprop_tf": RMSPROP_SETTINGS, "adam": ("adam_eps",)}


def unread_settings(config: TrainConfig, given: set[str], family: str) -> list[str]:
    """The settings in ``given`` (set by flag or config file) that this run never reads, each with why."""
    found = []
    for owners, (algos, names) in READ_ONLY_BY.items():
        found += [f"--{n.replace('_', '-')} is read by {owners} only, not --algo {config.algo}"
                  for n in names if n in given and config.algo not in algos]
    if family != "atari":
        found += [f"--{n.replace('_', '-')} is read on Atari only" for n in ATARI_SETTINGS if n in given]
    unread = set(given) - set(OPTIMIZER_SETTINGS[config.optimizer])
    for name in sorted(unread & {n for names in OPTIMIZER_SETTINGS.values() for n in names}):
        readers = " or ".join(o for o, names in OPTIMIZER_SETTINGS.items() if name in names)
        found.append(f"--{name.replace('_', '-')} is read by --optimizer {readers} only")
    return found


PRESET_DIR = Path(__file__).parent / "configs"


def preset_files(algo: str, family: str, env: str = "") -> list[Path]:
    """The preset YAML files for an algorithm on an env family, in the order they apply.

    ``env-{family}.yaml``: what the family needs whatever the algorithm (preprocessing, reward
    clipping, network, normalisation); ``{algo}.yaml``: the algorithm's own defaults;
    ``{algo}-{family}.yaml``: the algorithm's tuning for the family; ``suite-{env}.yaml`` when
    ``env`` names a task suite (its envs and step budget). Any may be missing.
    """
    names = (f"env-{family}.yaml", f"{algo}.yaml", f"{algo}-{family}.yaml", f"suite-{env}.yaml")
    return [PRESET_DIR / name for name in names if (PRESET_DIR / name).exists()]


def preset_values(algo: str, family: str, env: str = "") -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in preset_files(algo, family, env):
        values.update(load_yaml(path))
    return values


def field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig)}


# What a YAML list may hold for a tuple[int, ...], tuple[float, ...] or tuple[str, ...] setting.
TUPLE_ITEM_TYPES = {int: int, float: (int, float), str: str}
TUPLE_ITEM_NAMES = {int: "integers", float: "numbers", str: "strings"}


def type_problem(name: str, value: Any, annotation: Any) -> str | None:
    """Why ``value`` (from YAML) cannot be the setting ``name`` of type ``annotation``, or None."""
    options = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    for option in options:
        origin = typing.get_origin(option)
        if option is type(None) and value is None:
            return None
        if origin is Literal and value in typing.get_args(option):
            return None
        if origin is tuple and isinstance(value, (list, tuple)) and all(
                isinstance(v, TUPLE_ITEM_TYPES[typing.get_args(option)[0]]) and not isinstance(v, bool) for v in value):
            return None
        if option is bool and isinstance(value, bool):
            return None
        if option is int and isinstance(value, int) and not isinstance(value, bool):
            return None
        if option is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if option is str and isinstance(value, str) or option is Path and isinstance(value, (str, Path)):
            return None
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path",
             type(None): "null"}
    wanted = " or ".join(
        "one of " + ", ".join(map(str, typing.get_args(o))) if typing.get_origin(o) is Literal
        else f"a list of {TUPLE_ITEM_NAMES[typing.get_args(o)[0]]}" if typing.get_origin(o) is tuple
        else names[o] for o in options)
    return f"{name} must be {wanted}, got {value!r}"


def coerce(values: dict[str, Any], source: str) -> dict[str, Any]:
    """Check names and types of settings from a YAML file like flags; turn lists into tuples."""
    unknown = sorted(set(values) - field_names())
    if unknown:
        raise UserError(f"{source}: unknown setting(s) {', '.join(unknown)}")
    hints = typing.get_type_hints(TrainConfig)
    wrong = [problem for name, value in values.items() if (problem := type_problem(name, value, hints[name]))]
    if wrong:
        raise UserError(f"{source}: {'; '.join(wrong)}")
    out = dict(values)
    for name in ("hidden_sizes", "ray_actor_resources", "task_weights"):
        if isinstance(out.get(name), list):
            out[name] = tuple(out[name])
    if out.get("out") is not None:
        out["out"] = Path(out["out"])
    return out


class NumbersLoader(yaml.SafeLoader):
    """PyYAML's safe loader, reading numbers as users write them: YAML 1.1, which PyYAML follows,
    makes ``1e-3`` and ``1E5`` strings (its floats need a dot and a signed exponent), where YAML 1.2
    reads floats."""


NumbersLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def load_yaml(path: Path) -> dict[str, Any]:
    """A ``--config`` file or preset: its settings, type-checked; UserError (one line) when it cannot be read."""
    try:
        data = yaml.load(Path(path).read_text(), Loader=NumbersLoader)
    except FileNotFoundError:
        raise UserError(f"config file {path} does not exist") from None
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"cannot read config file {path}: {str(error).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of setting: value")
    return coerce(data, str(path))


def to_yaml(config: TrainConfig) -> str:
    values = dataclasses.asdict(config)
    values["hidden_sizes"] = list(config.hidden_sizes)
    values["ray_actor_resources"] = list(config.ray_actor_resources)
    values["task_weights"] = list(config.task_weights)
    values["out"] = str(config.out) if config.out is not None else None
    return yaml.safe_dump(values, sort_keys=False)


def with_values(config: TrainConfig, values: dict[str, Any]) -> TrainConfig:
    return dataclasses.replace(config, **values)


__all__ = ["TrainConfig", "problems", "preset_values", "load_yaml", "to_yaml", "coerce", "with_values"]
