"""Argument checks shared by the image stages: each error names the stage, the argument and what came."""
from __future__ import annotations

import math


def size_pair(owner: str, name: str, value: object, *, low: int = 1, high: int = 16384) -> tuple[int, int]:
    """An int ``n`` (meaning ``(n, n)``) or a pair ``(height, width)`` of ints in [low, high]."""
    pair = (value, value) if isinstance(value, int) and not isinstance(value, bool) else value
    ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) and low <= v <= high for v in pair)
    if not ok:
        raise ValueError(f"{owner}: {name} must be an integer or a pair (height, width) of integers in "
                         f"[{low}, {high}], got {value!r}")
    return int(pair[0]), int(pair[1])


def probability(owner: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{owner}: {name} must be a number in [0, 1], got {value!r}")
    return float(value)


def number_range(owner: str, name: str, value: object, *, low: float | None, high: float | None,
                 open_low: bool = False) -> tuple[float, float]:
    """A pair ``(min, max)`` with min <= max inside the bounds."""
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    if ok:
        a, b = float(value[0]), float(value[1])
        ok = a <= b and (low is None or (a > low if open_low else a >= low)) and (high is None or b <= high)
    if not ok:
        lo = "-inf" if low is None else f"{low}"
        hi = "inf" if high is None else f"{high}"
        bracket = "(" if open_low else "["
        raise ValueError(f"{owner}: {name} must be a pair (min, max) with min <= max, both in {bracket}{lo}, {hi}], "
                         f"got {value!r}")
    return a, b


def name(owner: str, value: object) -> str:
    if not isinstance(value, str) or not value or not value.replace("_", "").isalnum():
        raise ValueError(f"{owner}: name must be a non-empty string of letters, digits and '_', got {value!r}")
    return value
