"""Weights as they travel to Ray actors: a message of a full copy and deltas, each inline when
small or put in the object store once; the delta encoding (``--weight-delta``)."""

from __future__ import annotations

import zlib
from typing import NamedTuple

import numpy as np
import ray
import torch

from impactrl.config import TrainConfig


class WeightsMessage(NamedTuple):
    """The newest weights as actors receive them: a full copy (publication ``base``), then the
    deltas up to ``publication``, each the payload itself when small (it travels inside the call)
    or its ObjectRef (put once; an actor fetches it when a take brings it, and only what it lacks)."""

    version: int
    publication: int
    base: int
    parts: list


# Ray passes smaller values inside a call (its max_direct_call_object_size); larger weights are
# put in the object store once and passed by reference: a put has a fixed cost however small.
INLINE_BYTES = 100 * 1024


def shipped(payload, size: int):
    return payload if size < INLINE_BYTES else ray.put(payload)


def received(parts: list) -> list:
    refs = [part for part in parts if isinstance(part, ray.ObjectRef)]
    fetched = dict(zip(refs, ray.get(refs)))
    return [fetched[part] if isinstance(part, ray.ObjectRef) else part for part in parts]



# Publications per full copy with --weight-delta: a fresh actor fetches one copy and at most 15 deltas.
KEYFRAME_EVERY = 16
SAME_WIDTH_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
                  torch.bfloat16: torch.int16}


def _zipped(tensor: torch.Tensor) -> tuple[bytes, bytes]:
    """The bytes of a delta by significance: the high half (mostly zeros: sign, exponent, top of
    the mantissa, or the top of a small integer) through zlib; the low half, nearly random, as it is."""
    width = tensor.element_size()
    planes = tensor.contiguous().numpy().view(np.uint8).reshape(-1, width).T
    low = width // 2
    return planes[:low].tobytes(), zlib.compress(planes[low:].tobytes(), 1)


def _unzipped(data: tuple[bytes, bytes], dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    width = torch.empty((), dtype=dtype).element_size()
    planes = np.frombuffer(data[0] + zlib.decompress(data[1]), np.uint8).reshape(width, -1)
    return torch.from_numpy(planes.T.copy()).view(dtype).reshape(shape)


def encode_delta(new: dict[str, torch.Tensor], held: dict[str, torch.Tensor], bound: float | None) -> dict:
    """What turns ``held`` into ``new``: per float tensor the XOR of the bit patterns (exact), or
    with ``bound`` the difference in steps of 2 * bound (within bound, up to float rounding);
    anything else whole. ``apply_delta`` undoes it."""
    delta = {}
    for key, value in new.items():
        if bound is not None and value.dtype == torch.float32:
            steps = torch.round((value - held[key]) / (2 * bound))
            peak = steps.abs().max().item() if steps.numel() else 0
            dtype = next((t for t, top in ((torch.int8, 2**7), (torch.int16, 2**15), (torch.int32, 2**31)) if peak < top), None)
            delta[key] = ("steps", dtype, _zipped(steps.to(dtype))) if dtype is not None else ("whole", value.clone())
        elif value.dtype in SAME_WIDTH_INT:
            bits = SAME_WIDTH_INT[value.dtype]
            delta[key] = ("xor", bits, _zipped(value.view(bits) ^ held[key].view(bits)))
        else:
            delta[key] = ("whole", value.clone())
    return delta


def apply_delta(held: dict[str, torch.Tensor], delta: dict, bound: float | None) -> dict[str, torch.Tensor]:
    new = {}
    for key, (kind, *payload) in delta.items():
        old = held[key]
        if kind == "steps":
            new[key] = old + _unzipped(payload[1], payload[0], old.shape).to(old.dtype) * (2 * bound)
        elif kind == "xor":
            new[key] = (old.view(payload[0]) ^ _unzipped(payload[1], payload[0], old.shape)).view(old.dtype)
        else:
            new[key] = payload[0]
    return new


def delta_bytes(delta: dict) -> int:
    return sum(sum(map(len, payload[-1])) if kind != "whole" else payload[0].nbytes for kind, *payload in delta.values())


def delta_bound(config: TrainConfig) -> float | None:
    return config.weight_delta_bound if config.weight_delta == "lossy" else None
