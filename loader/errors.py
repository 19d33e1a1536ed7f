"""Errors that name the data at fault. Every bad-input error a user sees is one of these (or a plain
ValueError/TypeError for a bad argument), never a stack trace from inside DALI."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class DataError(ValueError):
    """A sample that cannot be read: ``where`` is the file, or ``file:line``; ``reason`` says what was wrong."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class PlacementError(ValueError):
    """A placement that this machine or this pipeline cannot run."""


class OnError(enum.Enum):
    """RAISE: stop at the first bad sample with a DataError. SKIP: leave it out, fill the batch from the next
    good samples, log it once and list it in ``Loader.skipped``."""

    RAISE = "raise"
    SKIP = "skip"


def parse_on_error(value: "OnError | str") -> OnError:
    if isinstance(value, OnError):
        return value
    try:
        return OnError(value)
    except ValueError:
        raise ValueError(f"on_error must be 'raise' or 'skip', got {value!r}") from None


@dataclass(frozen=True)
class Skipped:
    """One sample left out with ``on_error="skip"``: where it is, why, and the dataset index and epoch."""

    where: str
    reason: str
    index: int
    epoch: int
