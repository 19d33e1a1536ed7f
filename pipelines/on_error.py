"""What a bad sample does, for every pipeline."""
from __future__ import annotations

import enum

from .choices import parse_enum


class OnError(enum.Enum):
    """RAISE: stop at the first bad sample with a DataError naming the file (and line). SKIP: leave it out,
    keep every good sample exactly once, log it once and list it (``Loader.skipped``)."""

    RAISE = "raise"
    SKIP = "skip"


def parse_on_error(value: OnError | str) -> OnError:
    return parse_enum(OnError, "on_error", value)
