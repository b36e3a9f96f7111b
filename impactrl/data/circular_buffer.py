r"""IMPACT's circular buffer of learner batches.

Luo et al. 2020, "IMPACT: Importance Weighted Asynchronous Architectures with Clipped Target
Networks", arXiv 1912.00167, §3.2 (the circular buffer), with the sampling semantics of RLlib's
new-stack ``CircularBuffer`` (docs/algorithms.md#circular-buffer).

The buffer holds at most ``N = num_batches`` distinct batches, and each batch may be drawn at
most ``K = uses_per_batch`` times ("replay coefficient"). Conceptually it is a ring of N·K
*(batch, use)* slots:

- :meth:`CircularBuffer.add` puts a batch in with K unused slots. If N batches are already held,
  the **oldest** batch is evicted first, together with any uses it had left; those unused uses
  are counted in :attr:`evicted_unused_uses`.
- :meth:`CircularBuffer.sample` draws **uniformly at random among all remaining slots** (so a
  batch with more uses left is proportionally more likely), consumes that slot and returns its
  batch; a batch is dropped after its K-th use. Unlike RLlib, an empty buffer does not busy-wait:
  :meth:`sample` returns ``None``.

So a batch is used at most K times, uses of different batches interleave in random order, and
staleness is bounded by N (batches) and K (uses). If actors are faster than the learner, batches
are evicted before reaching K uses; if slower, every batch is used exactly K times.

Timeline with N = 2, K = 3 (``A:3`` = batch A with 3 uses left; oldest on the left; the
returned batches are one possible outcome of the random draws)::

    op            held after op         returned   evicted (unused uses)
    ------------  --------------------  ---------  ---------------------
    add(A)        [A:3]                 -          -
    sample()      [A:2]                 A          -
    add(B)        [A:2, B:3]            -          -
    sample()      [A:2, B:2]            B          -          (P(A) = 2/5, P(B) = 3/5)
    add(C)        [B:2, C:3]            -          A (2)      (N = 2 reached: oldest goes)
    sample()      [B:1, C:3]            B          -
    sample()      [B:0 -> gone, C:3]    B          -          (B used 3 = K times: dropped)
    sample()  x3  [C:0 -> gone]         C, C, C    -
    sample()      []                    None       -          (never blocks)

Batches are arbitrary Python objects and are held by reference (not copied). :meth:`state_dict`
gives the held batches, their uses left, the counters and the RNG state, so a checkpoint restores
the buffer exactly and its next draws are the same. The buffer is not thread-safe: one thread
(the learner's) adds and samples.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Callable, Optional

from impactrl.checkpoint import decode_python_rng, encode_python_rng

__all__ = ["CircularBuffer"]

_COUNTERS = ("total_draws", "total_added", "evicted_unused_uses")  # cumulative, in checkpoints


class _Entry:
    __slots__ = ("batch", "uses_left")

    def __init__(self, batch: Any, uses_left: int) -> None:
        self.batch = batch
        self.uses_left = uses_left


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a Python int >= 1, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class CircularBuffer:
    """At most ``num_batches`` batches, each drawable at most ``uses_per_batch`` times.

    Args:
        num_batches: N >= 1, the number of distinct batches held.
        uses_per_batch: K >= 1, how many times each batch may be drawn.
        seed: seed of the buffer's own :class:`random.Random` (``None``: seeded from the OS).

    Attributes:
        num_batches: N.
        uses_per_batch: K.
        total_draws: number of batches returned by :meth:`sample` so far (cumulative).
        total_added: number of batches passed to :meth:`add` so far (cumulative).
        evicted_unused_uses: uses still left on batches evicted by :meth:`add` (cumulative).
    """

    def __init__(self, num_batches: int, uses_per_batch: int, seed: Optional[int] = None) -> None:
        self.num_batches = _check_positive_int("num_batches", num_batches)
        self.uses_per_batch = _check_positive_int("uses_per_batch", uses_per_batch)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be a Python int or None, got {type(seed).__name__}")
        self._rng = random.Random(seed)
        self._entries: deque[_Entry] = deque()  # oldest first
        self._uses_left = 0
        self.total_draws = 0
        self.total_added = 0
        self.evicted_unused_uses = 0

    def add(self, batch: Any) -> None:
        """Append ``batch`` with K uses, first evicting the oldest batch if N are held.

        ``batch`` may be any object; :meth:`sample` returns it as-is (the same reference).
        """
        if len(self._entries) >= self.num_batches:
            oldest = self._entries.popleft()
            self._uses_left -= oldest.uses_left
            self.evicted_unused_uses += oldest.uses_left
        self._entries.append(_Entry(batch, self.uses_per_batch))
        self._uses_left += self.uses_per_batch
        self.total_added += 1

    def sample(self) -> Any:
        """Draw one remaining (batch, use) slot uniformly at random; ``None`` if empty.

        The drawn batch loses one use and is dropped once it has none left.
        """
        if self._uses_left == 0:
            return None
        k = self._rng.randrange(self._uses_left)
        for i, entry in enumerate(self._entries):  # noqa: B007 - i is used after the loop
            if k < entry.uses_left:
                break
            k -= entry.uses_left
        else:  # pragma: no cover - the counters are kept consistent above
            raise RuntimeError("CircularBuffer: uses_left counter out of sync")
        entry.uses_left -= 1
        self._uses_left -= 1
        self.total_draws += 1
        if entry.uses_left == 0:
            del self._entries[i]
        return entry.batch

    def __len__(self) -> int:
        """Number of batches held (each with at least one use left)."""
        return len(self._entries)

    @property
    def uses_left(self) -> int:
        """Total number of draws still available (Σ uses left over held batches)."""
        return self._uses_left

    def state_dict(self, encode: Callable[[Any], Any] = lambda batch: batch) -> dict[str, Any]:
        """Everything the buffer's future depends on; ``encode`` turns a held batch into what a
        checkpoint can hold (tensors and plain types)."""
        return {
            "entries": [{"batch": encode(e.batch), "uses_left": e.uses_left} for e in self._entries],
            "rng": encode_python_rng(self._rng.getstate()),
            "counters": {key: getattr(self, key) for key in _COUNTERS},
        }

    def load_state_dict(self, state: dict[str, Any], decode: Callable[[Any], Any] = lambda batch: batch) -> None:
        """Restore :meth:`state_dict`'s output. Keys that older versions wrote and this one no
        longer keeps (an entry's ``num_steps``, the ``evicted_unused_steps`` counter) are ignored."""
        self._entries = deque(_Entry(decode(e["batch"]), e["uses_left"]) for e in state["entries"])
        self._uses_left = sum(e.uses_left for e in self._entries)
        self._rng.setstate(decode_python_rng(state["rng"]))
        for key in _COUNTERS:
            setattr(self, key, state["counters"][key])

    def stats(self) -> dict[str, int]:
        """Counters for logging: held batches, uses left, draws, additions, evictions."""
        return {"held_batches": len(self._entries), "uses_left": self._uses_left,
                **{key: getattr(self, key) for key in _COUNTERS}}
