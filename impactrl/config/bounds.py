"""Bounds on settings: each declared once, beside its field (``bounded(default, bound)``), and
checked for every field in one loop (``checks.bound_problems``) when a config is loaded."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Bound:
    """What a setting's value must be: ``says`` as the error message words it (">= 1", "in (0, 1]"),
    ``holds`` the test. A setting that may be None passes as None."""

    says: str
    holds: Callable[[Any], bool]


def at_least(low: float, finite: bool = False) -> Bound:
    return Bound(f">= {low}", lambda value: value >= low and (not finite or math.isfinite(value)))


def above(low: float, finite: bool = False) -> Bound:
    """``> low``; with ``finite`` infinity is refused too (an unbounded threshold can mean "no limit")."""
    return Bound(f"> {low}", lambda value: value > low and (not finite or math.isfinite(value)))


def within(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Bound:
    says = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    return Bound(says, lambda value: (low < value if low_open else low <= value)
                 and (value < high if high_open else value <= high))


FINITE = Bound("a finite number", math.isfinite)
POSITIVE_INTEGERS = Bound("positive integers", lambda sizes: bool(sizes) and all(size >= 1 for size in sizes))
POSITIVE_NUMBERS = Bound("positive numbers", lambda items: all(item > 0 and math.isfinite(item) for item in items))


def bounded(default: Any, bound: Bound) -> Any:
    """A field with a default and the bound its value must keep."""
    return dataclasses.field(default=default, metadata={"bound": bound})


def bound_of(field: dataclasses.Field) -> Bound | None:
    return field.metadata.get("bound")
