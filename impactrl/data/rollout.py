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
of the real final observation, so the learner can bootstrap from it (docs/algorithms.md#episode-ends-and-truncation).
``episode_return[t]`` is the undiscounted, unclipped return of a whole game that ended after
a_t, NaN everywhere else. ``core_state`` is the recurrent state before x_0.

Stacked frames (Atari: each x_t is the newest ``S`` frames) are stored once: with
``spec.frame_stack = S`` a slot holds ``frames`` (each env's distinct frames, in the order they
came) and ``frame_index`` ``[T+1, E, S]`` (which of them make x_t); the learner rebuilds
``obs`` on its device with :func:`restack_frames`, bit for bit.

Slots are preallocated; fresh ones are filled with sentinels (NaN, -1, False) so a read of
unwritten data shows up in tests instead of passing as zeros.
"""

from __future__ import annotations

import math
import time
from collections import deque
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
    frame_stack: int = 1  # > 1: observations are stacks of this many frames, stored de-duplicated

    @property
    def frame_capacity(self) -> int:
        """Frames one env's unroll can hold: the first stack, one new frame per step, and room for
        ``frame_stack`` more that episode starts bring (an episodic-life reset skips one frame)."""
        return self.unroll_length + 2 * self.frame_stack

    def fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        T, E = self.unroll_length, self.num_envs
        if self.frame_stack > 1:
            observations = {"frames": ((self.frame_capacity, E, *self.obs_shape[1:]), self.obs_dtype),
                            "frame_index": ((T + 1, E, self.frame_stack), torch.int64)}
        else:
            observations = {"obs": ((T + 1, E, *self.obs_shape), self.obs_dtype)}
        fields = {
            **observations,
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

    def unroll(self, slot: int) -> tuple[dict[str, torch.Tensor], UnrollRecord, float]:
        """A committed slot's data (views, no copies), its record and when it was committed."""
        record = UnrollRecord(
            actor_id=int(self.actor_id[slot]), policy_version=int(self.policy_version[slot]),
            stage_seconds=dict(zip(ACTOR_STAGES, self.stage_seconds[slot].tolist())),
            env_errors=int(self.env_errors[slot]),
            reward_stats=None if self.reward_stats is None else self.reward_stats[slot].numpy())
        return {key: tensor[slot] for key, tensor in self.data.items()}, record, float(self.created_at[slot])

    def assemble(self, slots: list[int]) -> tuple[Batch, dict[str, torch.Tensor]]:
        """The given slots as one batch (see :class:`BatchAssembler`)."""
        assembler = BatchAssembler(self.spec, len(slots))
        for slot in slots:
            assembler.add(*self.unroll(slot))
        return assembler.take()


class BatchAssembler:
    """Unrolls in, time-major batches ``[T(+1), n * E, ...]`` of ``n = unrolls_per_batch`` out,
    each unroll copied once, into its columns of a batch allocated when its first unroll came.

    A new buffer per batch, since algorithms keep batches (IMPACT's buffer, PPO's epochs); on a
    CUDA learner it is pinned, so the copy to the device reads it directly (PyTorch's pinned
    allocator reuses a block only once the copies out of it have finished).

    ``take`` returns the oldest full batch and its per-unroll metadata: ``actor_id``,
    ``policy_version``, ``created_at`` (each ``[n * E]``) and per unroll ``slot_actor_id``,
    ``stage_seconds`` ``[n, len(ACTOR_STAGES)]``, ``env_errors`` and, with ``spec.reward_norm``,
    ``reward_stats`` ``[n, E, 3]``.
    """

    def __init__(self, spec: RolloutSpec, unrolls_per_batch: int, pin_memory: bool = False):
        self.spec = spec
        self.size = unrolls_per_batch
        self.pin_memory = pin_memory
        self.full: deque[tuple[Batch, list]] = deque()
        self._batch: Batch | None = None
        self._records: list[tuple[UnrollRecord, float]] = []
        self.seconds = 0.0  # spent copying, for the learner's time split

    def __len__(self) -> int:
        """Full batches ready to take."""
        return len(self.full)

    @property
    def filling(self) -> int:
        """Unrolls in the batch being filled."""
        return len(self._records)

    def _allocate(self) -> Batch:
        n, E = self.size, self.spec.num_envs
        batch = {}
        for key, (shape, dtype) in self.spec.fields().items():
            shape = (n * shape[0], *shape[1:]) if key.startswith("core_state_") else (shape[0], n * E, *shape[2:])
            batch[key] = torch.empty(shape, dtype=dtype, pin_memory=self.pin_memory)
        return batch

    def add(self, arrays: dict, record: UnrollRecord, created_at: float) -> None:
        """Copy one unroll (``spec.fields()``, as tensors or arrays) into the batch being filled."""
        began = time.perf_counter()
        if self._batch is None:
            self._batch = self._allocate()
        E = self.spec.num_envs
        columns = slice(len(self._records) * E, (len(self._records) + 1) * E)
        for key, target in self._batch.items():
            view = target[columns] if key.startswith("core_state_") else target[:, columns]
            value = arrays[key]
            if isinstance(value, torch.Tensor):
                view.copy_(value)
            else:  # numpy, possibly read-only (a Ray reply in the object store)
                view.numpy()[...] = value
        self._records.append((record, created_at))
        if len(self._records) == self.size:
            self.full.append((self._batch, self._records))
            self._batch, self._records = None, []
        self.seconds += time.perf_counter() - began

    def take(self) -> tuple[Batch, dict[str, torch.Tensor]]:
        batch, records = self.full.popleft()
        E = self.spec.num_envs
        actor_ids = torch.tensor([record.actor_id for record, _ in records], dtype=torch.int64)
        meta = {
            "actor_id": actor_ids.repeat_interleave(E),
            "policy_version": torch.tensor([r.policy_version for r, _ in records], dtype=torch.int64).repeat_interleave(E),
            "created_at": torch.tensor([at for _, at in records], dtype=torch.float64).repeat_interleave(E),
            "slot_actor_id": actor_ids,
            "stage_seconds": torch.tensor([[r.stage_seconds[stage] for stage in ACTOR_STAGES] for r, _ in records],
                                          dtype=torch.float64),
            "env_errors": torch.tensor([r.env_errors for r, _ in records], dtype=torch.int64),
        }
        if self.spec.reward_norm:
            meta["reward_stats"] = torch.stack([torch.as_tensor(r.reward_stats, dtype=torch.float64) for r, _ in records])
        return batch, meta


class FramePacker:
    """Actor side of frame de-duplication: writes each step's stack ``[E, S, ...]`` into a slot's
    ``frames`` and ``frame_index`` so that every distinct frame is stored once per env.

    A stack that is the previous one shifted by one frame (the common case) adds its newest frame;
    any other (the unroll's first stack, an episode start) reuses what equals a frame of the
    previous stack or its own previous frame (padding), and adds the rest. Equality is checked
    bytewise, so :func:`restack_frames` gives back exactly the stacks written.
    """

    def __init__(self, capacity: int, num_envs: int):
        self.capacity = capacity  # spec.frame_capacity
        self.count = np.zeros(num_envs, dtype=np.int64)  # frames used per env
        self.previous: np.ndarray | None = None

    def write(self, arrays: dict[str, np.ndarray], t: int, obs: np.ndarray) -> None:
        frames, index = arrays["frames"], arrays["frame_index"]
        if t == 0:
            self.count[:] = 0
            irregular = range(len(obs))
        else:
            shifted = (obs[:, :-1] == self.previous[:, 1:]).reshape(len(obs), -1).all(axis=1)
            envs = np.flatnonzero(shifted)
            if len(envs):
                self._check_room(envs)
                frames[self.count[envs], envs] = obs[envs, -1]
                index[t, envs, :-1] = index[t - 1, envs, 1:]
                index[t, envs, -1] = self.count[envs]
                self.count[envs] += 1
            irregular = np.flatnonzero(~shifted)
        for env in irregular:
            self._write_irregular(frames, index, t, int(env), obs[env])
        self.previous = obs.copy()

    def _write_irregular(self, frames: np.ndarray, index: np.ndarray, t: int, env: int, stack: np.ndarray) -> None:
        known = [] if t == 0 else [(self.previous[env, k], index[t - 1, env, k]) for k in range(len(stack))]
        for k, frame in enumerate(stack):
            if k > 0 and np.array_equal(frame, stack[k - 1]):
                index[t, env, k] = index[t, env, k - 1]
                continue
            match = next((at for old, at in known if np.array_equal(frame, old)), None)
            if match is None:
                self._check_room([env])
                match = self.count[env]
                frames[match, env] = frame
                self.count[env] += 1
            index[t, env, k] = match

    def _check_room(self, envs) -> None:
        """Room for one more frame in each of ``envs``, or FrameRoomExceeded."""
        if (self.count[envs] >= self.capacity).any():
            raise FrameRoomExceeded(
                f"frame de-duplication: an env's unroll brought more than {self.capacity} distinct frames (episodes "
                "shorter than a few steps?); run with --no-frame-dedup")


class FrameRoomExceeded(Exception):
    """More distinct frames in one env's unroll than a slot has room for."""


def restack_frames(batch: Batch) -> Batch:
    """The batch with ``obs`` ``[T+1, B, S, ...]`` rebuilt from ``frames`` ``[F, B, ...]`` and
    ``frame_index`` ``[T+1, B, S]`` (on their device; one gather); batches without frames as they are."""
    if "frames" not in batch:
        return batch
    batch = dict(batch)
    frames, index = batch.pop("frames"), batch.pop("frame_index")
    F, B, *frame_shape = frames.shape
    # Rows of frames.view(F * B, ...) are frame f of column b at f * B + b: one row-wise index_select.
    rows = (index * B + torch.arange(B, device=index.device)[None, :, None]).flatten()
    batch["obs"] = frames.reshape(F * B, -1).index_select(0, rows).view(*index.shape, *frame_shape)
    return batch


def keep_unrolls(batch: Batch, keep: torch.Tensor) -> Batch:
    """The batch's unrolls (columns) where ``keep`` ``[B]`` is True."""
    index = keep.nonzero().squeeze(1)
    return {key: value.index_select(0 if key.startswith("core_state_") else 1, index) for key, value in batch.items()}


def core_state(batch: Batch) -> tuple[torch.Tensor, ...]:
    """The recurrent state at the start of each unroll, as the agent takes it."""
    count = sum(1 for key in batch if key.startswith("core_state_"))
    return tuple(batch[f"core_state_{i}"] for i in range(count))


def to_device(batch: Batch, device: torch.device) -> Batch:
    """The batch on ``device``; from pinned memory (a CUDA learner's assembled batches) the copy
    is asynchronous, so it overlaps what the learner does next. A StagedBatch's copy was begun
    earlier: the current stream only waits for it to end."""
    if device.type == "cpu":
        return batch
    if isinstance(batch, StagedBatch):
        return batch.on_device()
    return {key: value.to(device, non_blocking=value.is_pinned()) for key, value in batch.items()}


class StagedBatch(dict):
    """A batch on the host (what the learner loop reads of it: returns, rewards, tasks, for its
    statistics) whose copy to the device, stacked frames rebuilt, runs on a side CUDA stream."""

    def __init__(self, batch: Batch, copy: Batch, copied: torch.cuda.Event, device: torch.device):
        super().__init__(batch)
        self._copy, self._copied, self._device = copy, copied, device

    def on_device(self) -> Batch:
        """The device copy, safe to use on the current stream: it waits for the copy, and the
        side stream's memory is not reused before the current stream is done with it."""
        current = torch.cuda.current_stream(self._device)
        current.wait_event(self._copied)
        for value in self._copy.values():
            value.record_stream(current)
        return self._copy


def stage_on_device(batch: Batch, device: torch.device, stream: torch.cuda.Stream) -> StagedBatch:
    """Begin copying ``batch`` (pinned) to ``device`` on ``stream`` and rebuilding its stacked
    frames there; the learner's step on the current stream goes on meanwhile."""
    with torch.cuda.stream(stream):
        copy = restack_frames({key: value.to(device, non_blocking=True) for key, value in batch.items()})
        copied = torch.cuda.Event()
        copied.record(stream)
    return StagedBatch(batch, copy, copied, device)
