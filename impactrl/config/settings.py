"""The settings of a training run, by concern; ``TrainConfig`` combines them into one frozen
dataclass whose fields are the CLI flags (read flat: ``config.learning_rate``).

Each bound is declared beside its field (``bounded(default, bound)``) and checked by
``checks.problems``; values derived from others (unrolls per slot, number of slots) are properties
of ``TrainConfig``, never fields rewritten after parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from impactrl.config.bounds import (FINITE, POSITIVE_INTEGERS, POSITIVE_NUMBERS, above, at_least, bounded,
                                    within)

EnvBackend = Literal["gymnasium", "envpool"]


@dataclass(frozen=True)
class RunSettings:
    """What to train, for how long, and where its files go."""

    algo: Literal["impala", "impact", "ppo"] = "impala"
    """Algorithm: impala (V-trace actor-critic), impact (IMPALA + target network + circular buffer), ppo (synchronous)."""
    env: str = "CartPole-v1"
    """Gymnasium id (CartPole-v1, MinAtar/Breakout-v1, ALE/Pong-v5, ...), or several tasks for one agent:
    ids separated by commas (one env family) or a suite (minatar = the five MinAtar games)."""
    task_weights: tuple[float, ...] = bounded((), POSITIVE_NUMBERS)
    """Several tasks: each task's share of the envs, one weight per task in --env's order (default: round-robin)."""
    total_env_steps: int = bounded(500_000, at_least(1))
    """Stop after this many environment steps (agent steps; an Atari step is frame_skip frames)."""
    max_wall_time_s: float | None = bounded(None, above(0))
    """Also stop after this many seconds of training in this invocation (None = no limit)."""
    stop_at_return: float | None = bounded(None, FINITE)
    """Also stop once the mean training return of the last 100 episodes reaches this (one task only)."""
    seed: int = bounded(1, within(0, 2**32 - 1))
    """Seed for the learner's initialisation and, offset per actor and env, for the environments; 0 to
    2**32 - 1, the seeds numpy, torch and EnvPool all take."""
    out: Path | None = None
    """Run directory for metrics.jsonl, tb/, config.yaml and checkpoints/ (default: runs/ENV-ALGO-seedS)."""


@dataclass(frozen=True)
class RuntimeSettings:
    """Where actors and learner run, and how the weights reach the actors."""

    runtime: Literal["local", "ray"] = "local"
    """Where actors and learner run: local = processes and shared memory on this machine; ray = Ray
    actors on a Ray cluster (pip install -e ".[ray]"), the learner in this process (docs/ray.md)."""
    ray_address: str | None = None
    """Ray runtime: the cluster to join, HOST:PORT of its head (or auto); None = start a local Ray
    instance for this run and stop it at the end. A joined cluster is left running."""
    ray_actor_cpus: float = bounded(1.0, at_least(0, finite=True))
    """Ray runtime: CPUs each actor asks Ray for."""
    ray_actor_resources: tuple[str, ...] = ()
    """Ray runtime: other resources each actor asks Ray for, as NAME=AMOUNT (e.g. actor=1 to keep
    actors on the nodes started with --resources '{"actor": 64}')."""
    publish_interval: int = bounded(1, at_least(1))
    """Publish the weights to the actors at most every N learner updates (saves copies on large
    models and GPU learners; PPO's actors still get every version they wait for)."""
    weight_delta: Literal["off", "lossless", "lossy"] = "off"
    """Ray runtime: broadcast weights as compressed differences against the previous publication
    (a full copy every 32): lossless = bit-exact (XOR, zlib); lossy = each weight an actor holds
    stays within weight_delta_bound of the learner's (quantised, zlib)."""
    weight_delta_bound: float = bounded(1e-4, above(0, finite=True))
    """Ray runtime, weight_delta lossy: the largest absolute difference between an actor's weight and the learner's."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Learner device; actors always run on the CPU."""
    num_learners: int = bounded(1, at_least(1))
    """Data-parallel learners: each trains on 1/N of every batch, fed by its share of the actors
    (actor i feeds learner i % N), and their gradients are reduced over torch.distributed (gloo on
    the CPU, NCCL with --device cuda: one GPU each) before the same optimiser step everywhere;
    learner 0 is this process and writes metrics and checkpoints; the others are processes here
    (local runtime) or Ray actors placed by learner_resources (docs/learners.md)."""
    learner_resources: tuple[str, ...] = ()
    """Ray runtime, num_learners > 1: what each learner other than learner 0 asks Ray for, as
    NAME=AMOUNT (CPU=4, GPU=1, a custom resource); default CPU=1."""

    learner_threads: int = bounded(0, at_least(0))
    """Intra-op threads for the learner's PyTorch ops; 0 = the cores the actors leave free (at least 1)."""
    actor_niceness: int = bounded(5, within(0, 19))
    """CPU niceness the actor processes add to the learner's (as nice(1) adds): where they share cores,
    the learner's step runs first and the actors take what it leaves; 0 = as equals (benchmarks/README.md)."""


@dataclass(frozen=True)
class ActorSettings:
    """Actors, unrolls and the batches made of them."""

    num_actors: int = bounded(2, at_least(1))
    """Actor processes, each stepping envs_per_actor environments with batched inference."""
    envs_per_actor: int = bounded(8, at_least(1))
    """Environments stepped in lockstep by one actor process."""
    unroll_length: int = bounded(20, at_least(1))
    """Steps per unroll (T); each unroll also carries the next observation for bootstrapping."""
    unrolls_per_batch: int = bounded(32, at_least(1))
    """IMPALA, IMPACT: unrolls (one per environment) per learner batch; a multiple of envs_per_actor.
    PPO (synchronous) always takes one from every env: num_actors * envs_per_actor."""
    rollout_slots: int = bounded(0, at_least(0))
    """Shared-memory rollout slots (one actor unroll each) of each learner; 0 = 2 * its actors + 2 * its batch slots."""
    max_policy_lag: int | None = bounded(None, at_least(0))
    """Drop unrolls the learner would train on more than this many versions after the policy that
    produced them (counted as unrolls_dropped); None = keep all."""


@dataclass(frozen=True)
class EnvSettings:
    """How actors step their environments (the env's own settings are checked by EnvOptions)."""

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
    fire_reset: bool = True
    """Atari: in games whose action 1 is FIRE, such as Breakout, press FIRE after each reset
    and each lost life, in training and evaluation: play never waits on the agent."""
    max_episode_steps: int | None = None
    """Truncate episodes after this many steps (None = the env's own limit)."""
    image_layout: Literal["auto", "chw", "hwc"] = "auto"
    """3-D Box observations of other envs than Atari and MinAtar: chw (channels first, as the CNNs
    take them), hwc (height x width x channels: transposed), auto (hwc when the last size is a
    channel count (<= 4, or at most half the others) and the first is not, chw the other way round;
    a shape that says neither is refused)."""


@dataclass(frozen=True)
class ModelSettings:
    """The network and the normalisation it carries."""

    torso: Literal["auto", "mlp", "minatar", "shallow_cnn", "nature_cnn", "resnet"] = "auto"
    """Feature extractor: auto picks mlp (vectors), minatar (small grids), shallow_cnn (Atari);
    nature_cnn (the DQN Nature net, CleanRL's) and resnet (IMPALA's deep net) when asked."""
    hidden_sizes: tuple[int, ...] = bounded((64, 64), POSITIVE_INTEGERS)
    """Hidden layer sizes of the MLP torso."""
    use_lstm: bool = False
    """Add an LSTM core fed with the previous action and clipped reward."""
    lstm_size: int = bounded(256, at_least(1))
    """Hidden units of the LSTM core."""
    separate_value_network: bool = False
    """Give the value function its own torso (CleanRL's MuJoCo PPO network); not with the LSTM."""
    normalize_observations: bool = False
    """Normalise vector observations by running mean and std, centre pixel frames on their running
    per-pixel mean; the statistics travel with the weights."""
    popart: bool = False
    """IMPALA, IMPACT: PopArt (Hessel et al. 2019): value targets normalised per task by running
    statistics, with the value head rewritten to preserve its outputs; lets tasks with different
    reward scales train together, with --reward-clip none."""
    popart_beta: float = bounded(3e-4, within(0, 1, low_open=True))
    """PopArt: step size of the statistics' moving averages (per learner update)."""
    normalize_rewards: bool = False
    """Scale rewards by the running std of the discounted return, per env, clipped to +-10 (CleanRL)."""
    squash_actions: bool = False
    """Continuous actions: tanh-squash the Gaussian into the action bounds (default: sample, then clip)."""
    log_std_init: float = 0.0
    """Continuous actions: initial log standard deviation of the Gaussian."""


@dataclass(frozen=True)
class LossSettings:
    """The actor-critic loss and V-trace (Espeholt et al. 2018)."""

    discount: float = bounded(0.99, within(0, 1))
    """Discount factor gamma."""
    baseline_cost: float = bounded(0.5, at_least(0))
    """Weight of the value loss."""
    entropy_cost: float = bounded(0.01, at_least(0))
    """Weight of the entropy bonus."""
    reward_clip: Literal["none", "abs_one"] = "none"
    """Reward transform in the loss: abs_one clips to [-1, 1] (returns are logged unclipped)."""
    clip_rho_threshold: float | None = bounded(1.0, above(0))
    """V-trace rho-bar: clips the importance weight in the TD error (None = no clipping)."""
    clip_pg_rho_threshold: float | None = bounded(1.0, above(0))
    """V-trace rho-bar for the policy-gradient advantage (None = no clipping)."""
    clip_c_threshold: float | None = bounded(1.0, above(0))
    """V-trace c-bar: clips the trace coefficients (None = no clipping)."""
    vtrace_lambda: float = bounded(1.0, within(0, 1))
    """V-trace lambda: c_t = lambda * min(c-bar, rho_t)."""
    off_policy_correction: Literal["vtrace", "none"] = "vtrace"
    """none = take the actors' data as on-policy (rho = c = 1 in V-trace): the IMPALA paper's no-correction
    baseline, an ablation."""


@dataclass(frozen=True)
class ImpactSettings:
    """IMPACT (Luo et al. 2020): circular buffer, target network, clipped surrogate."""

    buffer_batches: int = bounded(1, at_least(1))
    """IMPACT circular buffer: batches held (N)."""
    buffer_uses: int = bounded(2, at_least(1))
    """IMPACT circular buffer: SGD steps taken on each batch (K)."""
    buffer_fetch: Literal["free", "ready"] = "free"
    """IMPACT: when the learner takes a batch from the actors: free = only while the buffer has a free place
    (every batch gets its K steps; actors wait when the learner is slower); ready = whenever one is ready,
    evicting the oldest batch with its steps left, and training on the held batches while none is."""
    target_update_period: int = bounded(0, at_least(0))
    """IMPACT: learner updates between target-network refreshes (0 = 2 * N * K)."""
    target_update_tau: float = bounded(1.0, within(0, 1, low_open=True))
    """IMPACT: 1 = hard copy; < 1 = Polyak averaging with this weight."""
    target_scoring: Literal["use", "insert"] = "use"
    """IMPACT: score a batch with the target network at each use (RLlib) or once at insertion (the paper)."""
    use_target_network: bool = True
    """IMPACT ablation: without it the ratio is taken against the behaviour policy."""
    target_worker_clip: float | None = bounded(2.0, above(0))
    """IMPACT: rho in min(mu / pi_target, rho), the truncated IS weight (None = no truncation, an ablation)."""
    clip_param: float = bounded(0.4, above(0))
    """IMPACT and PPO: epsilon of the clipped surrogate."""
    use_kl_loss: bool = False
    """IMPACT: add KL(pi_target || pi) with an adaptive coefficient."""
    kl_coeff: float = bounded(1.0, above(0))
    """IMPACT: initial KL coefficient."""
    kl_target: float = bounded(0.01, above(0))
    """IMPACT: the KL the adaptive coefficient aims for."""


@dataclass(frozen=True)
class PPOSettings:
    """PPO (Schulman et al. 2017, CleanRL's defaults)."""

    gae_lambda: float = bounded(0.95, within(0, 1, low_open=True))
    """PPO: GAE lambda."""
    update_epochs: int = bounded(10, at_least(1))
    """PPO: passes over each batch."""
    num_minibatches: int = bounded(32, at_least(1))
    """PPO: minibatches per pass."""
    normalize_advantages: bool = True
    """PPO and IMPACT: normalise advantages per (mini)batch (IMPACT's preset turns it off, as RLlib)."""
    clip_value_loss: bool = True
    """PPO: clip the value update around the old value estimate."""


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimiser and its learning-rate schedule."""

    optimizer: Literal["rmsprop", "rmsprop_tf", "adam"] = "rmsprop"
    """RMSProp in PyTorch's form, RMSProp in TensorFlow 1's (the IMPALA paper's: ε under the root, mean
    square from 1; docs/algorithms.md#rmsprop-tensorflows-form-and-pytorchs) or Adam (IMPACT, PPO)."""
    learning_rate: float = bounded(6e-4, above(0, finite=True))
    """Learning rate."""
    rmsprop_alpha: float = bounded(0.99, within(0, 1, low_open=True, high_open=True))
    """RMSProp smoothing constant (decay)."""
    rmsprop_eps: float = bounded(0.01, above(0, finite=True))
    """RMSProp epsilon: added to the root mean square with rmsprop, under the root with rmsprop_tf (the
    IMPALA paper's 0.01 there is about 0.1 in PyTorch's form)."""
    rmsprop_momentum: float = bounded(0.0, at_least(0))
    """RMSProp momentum."""
    adam_eps: float = bounded(1e-5, above(0))
    """Adam epsilon."""
    lr_decay: bool = True
    """Anneal the learning rate linearly to 0 over total_env_steps, or over max_wall_time_s when that
    budget ends first (then the schedule depends on the machine's speed)."""
    lr_decay_env_steps: int | None = bounded(None, at_least(1))
    """Anneal over this many env steps, not over total_env_steps or max_wall_time_s: a run capped
    sooner keeps a longer run's schedule (to compare the two, or to branch one); None = as lr_decay says."""
    grad_norm_clip: float = bounded(40.0, above(0, finite=True))
    """Clip the global gradient norm to this value."""
    learner_precision: Literal["float32", "bfloat16"] = "float32"
    """bfloat16: autocast the learner's convolutions and matmuls to bfloat16 (losses, V-trace and
    optimiser stay float32). Faster learner steps on CPUs with AMX / AVX-512 BF16 and on recent
    GPUs; slower on CPUs without them. Actors always infer in float32."""


@dataclass(frozen=True)
class LoggingSettings:
    """Metrics and checkpoints."""

    wandb_project: str | None = None
    """Also log the metrics to Weights & Biases under this project (pip install -e ".[wandb]"); offline
    unless WANDB_MODE says otherwise: files in RUN_DIR/wandb, uploaded later with `wandb sync`."""
    log_interval_s: float = bounded(5.0, above(0, finite=True))
    """Seconds between metrics lines (terminal, metrics.jsonl, TensorBoard)."""
    checkpoint_interval_s: float = bounded(60.0, above(0, finite=True))
    """Seconds between checkpoints (what a hard kill of the learner can lose); one is always written at the end."""
    keep_checkpoints: int = bounded(3, at_least(1))
    """How many checkpoints to keep on disk (a corrupt newest one falls back to the one before)."""
    milestone_env_steps: int | None = bounded(None, at_least(1))
    """Also keep, outside that rotation, the first checkpoint at or past each multiple of this many
    env steps, as checkpoints/steps_N.pt (to evaluate the agent along the way); None = none."""


@dataclass(frozen=True)
class FaultSettings:
    """How many faults a run survives."""

    max_actor_restarts: int = bounded(5, at_least(0))
    """Restarts of one actor (after it died or hung) within actor_restart_window_s before the run stops (0 = stop at once)."""
    actor_restart_window_s: float = bounded(600.0, above(0, finite=True))
    """Seconds over which max_actor_restarts is counted."""
    actor_stall_timeout_s: float = bounded(60.0, above(0, finite=True))
    """An actor without a heartbeat for this long is killed and restarted; the learner reports waiting this long for data."""
    max_skipped_updates: int = bounded(10, at_least(1))
    """Updates in a row with a non-finite loss or gradient (each skipped) before the run stops (checked at each metrics line)."""


# Dataclass fields follow the bases in reverse: the flags and config.yaml list the settings from
# RunSettings to FaultSettings.
@dataclass(frozen=True)
class TrainConfig(FaultSettings, LoggingSettings, OptimizerSettings, PPOSettings, ImpactSettings, LossSettings,
                  ModelSettings, EnvSettings, ActorSettings, RuntimeSettings, RunSettings):
    """Train an agent with IMPALA, IMPACT or PPO on many actor processes and one learner."""

    @property
    def synchronous(self) -> bool:
        """PPO: actors wait for the weights trained on their last unroll before the next one."""
        return self.algo == "ppo"

    @property
    def effective_unrolls_per_batch(self) -> int:
        """Unrolls (one env's T steps each) in a learner batch: unrolls_per_batch, or PPO's every env's."""
        return self.num_actors * self.envs_per_actor if self.synchronous else self.unrolls_per_batch

    @property
    def slots_per_batch(self) -> int:
        """Actor unrolls (shared-memory slots) that make one learner's batch: with several learners
        each takes 1/num_learners of every batch."""
        return self.effective_unrolls_per_batch // self.envs_per_actor // self.num_learners

    @property
    def actors_per_learner(self) -> int:
        """The most actors one learner feeds on (actor i feeds learner i % num_learners)."""
        return -(-self.num_actors // self.num_learners)

    @property
    def effective_target_update_period(self) -> int:
        """IMPACT: learner updates between target refreshes: target_update_period, or when that is 0 the
        paper's n * N * K with n = 2."""
        return self.target_update_period or 2 * self.buffer_batches * self.buffer_uses

    @property
    def effective_rollout_slots(self) -> int:
        """Shared-memory rollout slots of one learner: rollout_slots, or when that is 0 enough for each of
        its actors to write while a batch trains."""
        return self.rollout_slots or 2 * self.actors_per_learner + 2 * self.slots_per_batch

    @property
    def steps_per_batch(self) -> int:
        return self.effective_unrolls_per_batch * self.unroll_length

    def run_dir(self) -> Path:
        return self.out if self.out is not None else Path("runs") / f"{self.env.replace('/', '_')}-{self.algo}-seed{self.seed}"

