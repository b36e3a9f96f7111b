"""The rollout schema: what one actor unroll holds, and how unrolls become a learner batch.

One *slot* holds one actor's unroll over its E environments, time-major::

    index t:        0      1      ...    T-1     T
    obs, first,     x_0    x_1    ...    x_T-1   x_T     (T+1 entries: x_T is the next unroll's x_0)
    prev_action,
    prev_reward,
    task
    action,         a_0    a_1    ...    a_T-1           (T entries: a_t is taken at x_t and
    behaviour_      r_0    r_1    ...    r_T-1            yields r_t, terminated_t, truncated_t)
    log_prob, ...

``task[t]`` is the index of the task (``--env``'s order) the env plays; 0 in single-task runs.
``first[t]`` marks x_t as the first observation of an episode (the recurrent core resets before
it). ``truncated[t]`` means the episode was cut by a time limit after a_t: x_{t+1} is then already
the reset observation of the next episode, and ``truncation_value[t]`` holds the actor's value
of the real final observation, so the learner can bootstrap from it (ALGORITHMS.md §a.5).
``episode_return[t]`` is the undiscounted, unclipped return of a whole game that ended after
a_t, NaN everywhere else. ``core_state`` is the recurrent state before x_0.

Slots are preallocated; fresh ones are filled with sentinels (NaN, -1, False) so a read of
unwritten data shows up in tests instead of passing as zeros.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

Batch = dict[str, torch.Tensor]

# Keys with T+1 entries (the observation side); all other time-indexed keys have T entries.
OBSERVATION_KEYS = ("obs", "first", "prev_action", "prev_reward", "task")


@dataclass(frozen=True)
class RolloutSpec:
    """Shapes and dtypes of one slot, derived from the env's spaces and the agent's core."""

    unroll_length: int
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    action_shape: tuple[int, ...]
    action_dtype: torch.dtype
    core_state_shapes: tuple[tuple[int, ...], ...] = ()
    reward_norm: bool = False  # slots also carry the envs' reward-normalisation statistics

    def fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        T, E = self.unroll_length, self.num_envs
        fields = {
            "obs": ((T + 1, E, *self.obs_shape), self.obs_dtype),
            "first": ((T + 1, E), torch.bool),
            "prev_action": ((T + 1, E, *self.action_shape), self.action_dtype),
            "prev_reward": ((T + 1, E), torch.float32),
            "task": ((T + 1, E), torch.int64),
            "action": ((T, E, *self.action_shape), self.action_dtype),
            "behaviour_log_prob": ((T, E), torch.float32),
            "reward": ((T, E), torch.float32),
            "terminated": ((T, E), torch.bool),
            "truncated": ((T, E), torch.bool),
            "truncation_value": ((T, E), torch.float32),
            "episode_return": ((T, E), torch.float32),
            "episode_length": ((T, E), torch.int64),
        }
        for i, shape in enumerate(self.core_state_shapes):
            fields[f"core_state_{i}"] = (shape, torch.float32)
        return fields


def data_bytes(spec: RolloutSpec) -> int:
    """Bytes of one slot's unroll data."""
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in spec.fields().values())


def sentinel(dtype: torch.dtype) -> float | int | bool:
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return False
    return -1


# Where an actor's time went while it produced one unroll (seconds), stored per slot.
ACTOR_STAGES = ("env", "inference", "wait")

# Per env, NormalizeReward's running statistics of the discounted return: mean, var, count.
REWARD_STATS_SIZE = 3


@dataclass
class UnrollRecord:
    """What an actor reports with an unroll besides its data (stored as the slot's metadata)."""

    actor_id: int
    policy_version: int  # version of the behaviour policy μ that acted
    stage_seconds: dict[str, float]  # the actor's time per ACTOR_STAGES for this unroll
    env_errors: int = 0  # env faults recovered from (envs rebuilt, unroll dropped) since the last unroll
    reward_stats: np.ndarray | None = None  # [E, 3] reward-normaliser statistics after the unroll


class SlotStore:
    """``num_slots`` preallocated slots, one tensor per field with a leading slot dimension.

    The tensors live in shared memory when ``shared`` is set, so actor processes write into
    them and only slot indices cross process boundaries. Each slot also carries who wrote it:
    ``actor_id``, ``policy_version`` (the behaviour policy's version), ``created_at`` and
    ``stage_seconds`` (the actor's time in each of ``ACTOR_STAGES`` for this unroll),
    ``env_errors`` (env faults the actor recovered from since its previous unroll) and, with
    ``spec.reward_norm``, ``reward_stats`` (``[E, 3]``, the envs' reward normalisers after it),
    so the learner holds them for checkpoints and restarted actors.
    """

    def __init__(self, spec: RolloutSpec, num_slots: int, shared: bool = True):
        self.spec = spec
        self.num_slots = num_slots
        self.data: dict[str, torch.Tensor] = {}
        for key, (shape, dtype) in spec.fields().items():
            self.data[key] = torch.full((num_slots, *shape), sentinel(dtype), dtype=dtype)
        self.actor_id = torch.full((num_slots,), -1, dtype=torch.int64)
        self.policy_version = torch.full((num_slots,), -1, dtype=torch.int64)
        self.created_at = torch.full((num_slots,), float("nan"), dtype=torch.float64)
        self.stage_seconds = torch.full((num_slots, len(ACTOR_STAGES)), float("nan"), dtype=torch.float64)
        self.env_errors = torch.zeros((num_slots,), dtype=torch.int64)
        self.reward_stats = (torch.full((num_slots, spec.num_envs, REWARD_STATS_SIZE), float("nan"), dtype=torch.float64)
                             if spec.reward_norm else None)
        if shared:
            for tensor in self.tensors():
                tensor.share_memory_()

    def tensors(self) -> list[torch.Tensor]:
        meta = [self.actor_id, self.policy_version, self.created_at, self.stage_seconds, self.env_errors]
        return [*self.data.values(), *meta, *([self.reward_stats] if self.reward_stats is not None else [])]

    def slot_arrays(self, index: int) -> dict[str, np.ndarray]:
        """Writable numpy views of one slot (no copies), for the actor's per-step writes."""
        return {key: tensor[index].numpy() for key, tensor in self.data.items()}

    def record(self, slot: int, record: UnrollRecord, created_at: float) -> None:
        """Write a committed unroll's metadata into its slot."""
        self.actor_id[slot] = record.actor_id
        self.policy_version[slot] = record.policy_version
        self.created_at[slot] = created_at
        self.stage_seconds[slot] = torch.tensor([record.stage_seconds[stage] for stage in ACTOR_STAGES])
        self.env_errors[slot] = record.env_errors
        if self.reward_stats is not None and record.reward_stats is not None:
            self.reward_stats[slot] = torch.from_numpy(record.reward_stats)

    def gather(self, indices: list[int]) -> tuple[Batch, dict[str, torch.Tensor]]:
        """Copy the given slots into one time-major batch ``[T(+1), len(indices) * E, ...]``.

        Returns the batch and the per-unroll metadata (``actor_id``, ``policy_version``,
        ``created_at``, each of shape ``[len(indices) * E]``; per slot ``slot_actor_id``,
        ``stage_seconds`` ``[len(indices), len(ACTOR_STAGES)]``, ``env_errors`` and, with
        ``spec.reward_norm``, ``reward_stats`` ``[len(indices), E, 3]``). Slots can be reused as
        soon as this returns.
        """
        index = torch.as_tensor(indices, dtype=torch.int64)
        batch: Batch = {}
        for key, tensor in self.data.items():
            chosen = tensor.index_select(0, index)  # [n, ..., E, ...]
            if key.startswith("core_state_"):
                batch[key] = chosen.flatten(0, 1)  # [n * E, H]
            else:
                # [n, T, E, ...] -> [T, n, E, ...] -> [T, n * E, ...]
                batch[key] = chosen.transpose(0, 1).flatten(1, 2)
        E = self.spec.num_envs
        meta = {
            "actor_id": self.actor_id.index_select(0, index).repeat_interleave(E),
            "policy_version": self.policy_version.index_select(0, index).repeat_interleave(E),
            "created_at": self.created_at.index_select(0, index).repeat_interleave(E),
            "slot_actor_id": self.actor_id.index_select(0, index),
            "stage_seconds": self.stage_seconds.index_select(0, index),
            "env_errors": self.env_errors.index_select(0, index),
        }
        if self.reward_stats is not None:
            meta["reward_stats"] = self.reward_stats.index_select(0, index)
        return batch, meta


def keep_unrolls(batch: Batch, keep: torch.Tensor) -> Batch:
    """The batch's unrolls (columns) where ``keep`` ``[B]`` is True."""
    index = keep.nonzero().squeeze(1)
    return {key: value.index_select(0 if key.startswith("core_state_") else 1, index) for key, value in batch.items()}


def core_state(batch: Batch) -> tuple[torch.Tensor, ...]:
    """The recurrent state at the start of each unroll, as the agent takes it."""
    count = sum(1 for key in batch if key.startswith("core_state_"))
    return tuple(batch[f"core_state_{i}"] for i in range(count))


class DeviceTransfer:
    """Moves batches to the learner's device; to a GPU through reusable pinned staging buffers.

    Pinning a fresh batch costs a page-locked allocation each time; instead each field is
    copied into a buffer pinned once, and the host-to-device copy runs asynchronously from it.
    Before a buffer is overwritten, the previous copy out of it must have finished: a CUDA
    event recorded after the copies is waited on first.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._staging: dict[str, torch.Tensor] = {}
        self._copied: torch.cuda.Event | None = None

    def __call__(self, batch: Batch) -> Batch:
        if self.device.type == "cpu":
            return batch
        if self._copied is not None:
            self._copied.synchronize()
        moved = {}
        for key, value in batch.items():
            staging = self._staging.get(key)
            if staging is None or staging.shape != value.shape or staging.dtype != value.dtype:
                staging = self._staging[key] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            staging.copy_(value)
            moved[key] = staging.to(self.device, non_blocking=True)
        self._copied = torch.cuda.Event()
        self._copied.record()
        return moved
