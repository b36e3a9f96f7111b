"""Checks of a config's values before any process starts: every field's bound (declared beside
it, ``settings.py``) in one loop, then the checks that relate several fields, then the Ray
settings' formats. ``unread_settings`` names the settings a run was given but never reads."""

from __future__ import annotations

import dataclasses

from impactrl.config.bounds import bound_of
from impactrl.config.settings import TrainConfig


def problems(config: TrainConfig) -> list[str]:
    """Every problem with a config's values, each as a short phrase (empty when all is well)."""
    return (bound_problems(config) + batch_problems(config) + learner_problems(config) + combination_problems(config)
            + ray_problems(config))


def bound_problems(config: TrainConfig) -> list[str]:
    """Each field's value against the bound declared beside it. The env's own settings (frame_skip,
    frame_stack, noop_max, sticky_action_prob, max_episode_steps) are checked by EnvOptions.problems."""
    found = []
    for field in dataclasses.fields(config):
        bound, value = bound_of(field), getattr(config, field.name)
        if bound is None or value is None or bound.holds(value):
            continue
        or_none = " or None" if str(field.type).replace(" ", "").endswith("|None") else ""
        shown = list(value) if isinstance(value, tuple) else value
        found.append(f"{field.name} must be {bound.says}{or_none}, got {shown}")
    return found


def batch_problems(config: TrainConfig) -> list[str]:
    """The batch against the envs, the step budget and the slots (each once its parts are valid)."""
    found = []
    if (not config.synchronous and config.unrolls_per_batch >= 1 and config.envs_per_actor >= 1
            and config.unrolls_per_batch % config.envs_per_actor):
        found.append(f"unrolls_per_batch={config.unrolls_per_batch} must be a multiple of "
                     f"envs_per_actor={config.envs_per_actor}")
    if config.total_env_steps >= 1 and config.steps_per_batch > config.total_env_steps:
        found.append(f"total_env_steps={config.total_env_steps:,} is less than one batch "
                     f"({config.effective_unrolls_per_batch} unrolls of {config.unroll_length} steps = "
                     f"{config.steps_per_batch:,}): raise --total-env-steps or lower --unroll-length or the batch")
    if config.algo == "ppo" and config.num_minibatches > config.steps_per_batch:
        found.append(f"num_minibatches={config.num_minibatches} exceeds the {config.steps_per_batch} steps of a batch")
    if config.rollout_slots > 0 and config.envs_per_actor >= 1 and config.slots_per_batch >= 1 \
            and config.rollout_slots < (fewest := max(config.slots_per_batch + 1, config.actors_per_learner)):
        found.append(f"rollout_slots={config.rollout_slots} must be >= {fewest} "
                     "(one learner's batch plus one slot an actor can write, and one slot per actor)")
    return found


def envs_split_for_learners(config: TrainConfig, given: set[str]) -> tuple[TrainConfig, str | None]:
    """With several learners and a preset's ``envs_per_actor`` (not ``given``) that does not split
    the batch into equal shares: the most envs per actor that does, keeping the batch (what the
    preset's learning rate was chosen for), and a note that says so. Else ``config`` as it is."""
    learners, envs, batch = config.num_learners, config.envs_per_actor, config.unrolls_per_batch
    if (learners <= 1 or config.synchronous or "envs_per_actor" in given or envs < 1 or batch < 1
            or batch % (learners * envs) == 0 or batch % learners):
        return config, None
    fitting = max(d for d in range(1, envs) if batch // learners % d == 0)
    note = (f"{fitting} envs per actor instead of the preset's {envs}, so that each of the {learners} learners "
            f"takes an equal share ({batch // learners} unrolls) of the batch of {batch}")
    return dataclasses.replace(config, envs_per_actor=fitting), note


def learner_problems(config: TrainConfig) -> list[str]:
    """Several learners: each needs its own actors and an equal share of every batch (their gradients
    are reduced in lockstep, so the shares must match)."""
    learners = config.num_learners
    if learners <= 1 or config.num_actors < 1 or config.envs_per_actor < 1:
        return []
    found = []
    if config.num_actors < learners:
        found.append(f"num_learners={learners} needs num_actors >= {learners} (each learner is fed by its own actors)")
    if config.synchronous and config.num_actors % learners:
        found.append(f"ppo with num_learners={learners} needs num_actors a multiple of {learners} "
                     f"(each learner's batch is one unroll from each of its actors' envs), got {config.num_actors}")
    share = learners * config.envs_per_actor
    if not config.synchronous and config.unrolls_per_batch >= 1 and config.unrolls_per_batch % share:
        batch = config.unrolls_per_batch
        fixes = [f"--unrolls-per-batch {-(-batch // share) * share}"]
        if batch % learners == 0:
            fixes.append(f"--envs-per-actor {max(d for d in range(1, config.envs_per_actor) if batch // learners % d == 0)}")
        found.append(f"unrolls_per_batch={batch} must be a multiple of num_learners * envs_per_actor = {share} (each "
                     f"learner takes an equal share of every batch): e.g. {' or '.join(fixes)}")
    if config.synchronous and config.num_minibatches > config.steps_per_batch // learners:
        found.append(f"num_minibatches={config.num_minibatches} exceeds the {config.steps_per_batch // learners} "
                     f"steps of one learner's share of a batch")
    if config.max_policy_lag is not None:
        found.append("max_policy_lag with num_learners > 1 is not supported (dropped unrolls would make the "
                     "learners' shares unequal)")
    return found


def combination_problems(config: TrainConfig) -> list[str]:
    """Settings that cannot go together."""
    found = []
    if config.algo == "ppo" and config.use_lstm:
        found.append("ppo with use_lstm is not supported yet (its minibatches are single steps); use impala or impact")
    if config.separate_value_network and config.use_lstm:
        found.append("separate_value_network cannot be combined with use_lstm")
    if config.popart and config.algo == "ppo":
        found.append("popart needs the V-trace learners: use --algo impala or impact")
    return found


def ray_problems(config: TrainConfig) -> list[str]:
    """The Ray settings' formats (their numbers have bounds beside their fields); whether the cluster
    can hold the actors is checked when joining it."""
    found = []
    if config.runtime != "ray":
        if config.ray_address is not None or config.ray_actor_resources or config.learner_resources:
            found.append("--ray-address, --ray-actor-resources and --learner-resources need --runtime ray")
        return found
    if config.learner_resources and config.num_learners == 1:
        found.append("--learner-resources places learners 1..N-1: it needs --num-learners 2 or more "
                     "(learner 0 is the train process)")
    for item in config.learner_resources:
        name, _, amount = item.partition("=")
        try:
            valid = bool(name) and float(amount) >= 0
        except ValueError:
            valid = False
        if not valid:
            found.append(f"learner_resources: {item!r} is not NAME=AMOUNT with an amount >= 0 (e.g. GPU=1, CPU=4)")
    address = config.ray_address
    if address is not None and address != "auto":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            found.append(f"ray_address must be HOST:PORT (the head node's GCS address, e.g. 10.0.0.1:6379) or "
                         f"auto, got {address!r}")
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


def learner_resources(config: TrainConfig) -> dict[str, float]:
    """``--learner-resources`` as Ray takes them, CPU=1 unless given (validated by ``problems``)."""
    return {"CPU": 1.0, **{name: float(amount) for name, _, amount in (item.partition("=") for item in config.learner_resources)}}


# Settings only some algorithms, env families or optimisers read.
READ_ONLY_BY = {
    "IMPACT": ({"impact"}, ("buffer_batches", "buffer_uses", "buffer_fetch", "target_update_period", "target_update_tau",
                            "target_scoring", "use_target_network", "target_worker_clip", "use_kl_loss", "kl_coeff",
                            "kl_target")),
    "PPO": ({"ppo"}, ("gae_lambda", "update_epochs", "num_minibatches", "clip_value_loss")),
    "IMPACT and PPO": ({"impact", "ppo"}, ("clip_param", "normalize_advantages")),
    "IMPALA and IMPACT (V-trace)": ({"impala", "impact"}, ("clip_rho_threshold", "clip_pg_rho_threshold",
                                                           "clip_c_threshold", "vtrace_lambda", "off_policy_correction",
                                                           "unrolls_per_batch", "max_policy_lag", "popart_beta")),
}
ATARI_SETTINGS = ("frame_skip", "frame_stack", "noop_max", "sticky_action_prob", "episodic_life", "fire_reset",
                  "frame_dedup")
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
    if config.off_policy_correction == "none":
        found += [f"--{n.replace('_', '-')} is read with --off-policy-correction vtrace only"
                  for n in ("clip_rho_threshold", "clip_pg_rho_threshold", "clip_c_threshold") if n in given]
    if "lr_decay_env_steps" in given and not config.lr_decay:
        found.append("--lr-decay-env-steps is read with --lr-decay only")
    return found


