"""Checks of argument values, shared by every layer: each returns the value as the plain Python type it checked
(a NumPy integer comes back an ``int``), or raises a ``ValueError`` (``TypeError`` where the type is wrong and
the value could not be meant) that names the argument, what it must be and what came.

``name`` is how the user wrote the argument (``"batch_size"``, ``"RayWorkers.num_workers"``)."""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def positive_int(name: str, value: Any) -> int:
    """An integer >= 1."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def int_at_least(name: str, value: Any, low: int) -> int:
    """An integer >= ``low``."""
    if not _is_int(value) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def int_in(name: str, value: Any, low: int, high: int) -> int:
    """An integer in [``low``, ``high``] (both included)."""
    if not _is_int(value) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def optional_positive_int(name: str, value: Any) -> int | None:
    """None, or an integer >= 1."""
    return None if value is None else positive_int(name, value)


def finite_at_least(name: str, value: Any, low: float) -> float:
    """A finite number >= ``low``."""
    if not _is_number(value) or not math.isfinite(value) or value < low:
        raise ValueError(f"{name} must be a finite number >= {low}, got {value!r}")
    return float(value)


def positive_seconds(name: str, value: Any) -> float:
    """A finite number of seconds > 0."""
    if not _is_number(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def flag(name: str, value: Any) -> bool:
    """True or False (not 0, 1 or a string, which are more often a misplaced argument than a flag)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def one_of(name: str, value: Any, choices: Iterable[str]) -> str:
    """One of ``choices`` (strings)."""
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return value
