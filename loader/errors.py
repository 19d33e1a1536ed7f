"""Errors that name the data at fault. Every bad-input error a user sees is one of these (or a plain
ValueError/TypeError for a bad argument), never a stack trace from inside DALI."""
from __future__ import annotations

from dataclasses import dataclass

from ..pipelines.on_error import OnError, parse_on_error  # noqa: F401  (re-exported)


class DataError(ValueError):
    """A sample that cannot be read: ``where`` is the file, or ``file:line``; ``reason`` says what was wrong."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class PlacementError(ValueError):
    """A placement that this machine or this pipeline cannot run."""


@dataclass(frozen=True)
class Skipped:
    """One sample left out with ``on_error="skip"``: where it is (file, ``file:line``, or shard and member),
    why, and, for a sample that had a dataset index when it was met, that index and the epoch. A file that a
    tabular source leaves out when it opens its files (an empty one) holds no numbered row: no index, no epoch."""

    where: str
    reason: str
    index: int | None = None
    epoch: int | None = None
