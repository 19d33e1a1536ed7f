"""Whether to cache a pipeline's deterministic prefix: the user's setting and the measured decision.

The rule is Cachew's: keep the prefix's outputs only where recomputing them costs more than reading them back
from the cache, and only where they fit (the RAM budget, or the free space of the cache's directory).
``CacheMode.ON`` forces the cache wherever it fits, ``CacheMode.OFF`` never caches, ``CacheMode.AUTO`` (the
default) follows the measurements. Every decision says why in words, with the figures it used.
"""
from __future__ import annotations

import enum
import math
import os
import shutil
from dataclasses import asdict, dataclass
from typing import Any

from ..pipelines.validate import int_at_least, positive_int
from .byte_units import format_bytes

DEFAULT_MEMORY_BYTES = 2 << 30  # RAM a cache may hold when no directory is given (2 GiB)


class CacheMode(enum.Enum):
    """``AUTO``: cache where measured to pay and it fits; ``ON``: cache wherever it fits; ``OFF``: never."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


def parse_cache_mode(value: CacheMode | str, name: str = "cache") -> CacheMode:
    """A ``CacheMode`` from itself or its value ("auto", "on", "off")."""
    if isinstance(value, CacheMode):
        return value
    if isinstance(value, str):
        try:
            return CacheMode(value.lower())
        except ValueError:
            pass
    raise ValueError(f"{name} must be one of 'auto', 'on', 'off' (or a feedline.loader.cache_policy.CacheSettings),"
                     f" got {value!r}")


@dataclass(frozen=True)
class CacheSettings:
    """What a user allows a cache: ``mode``; ``memory_bytes``, the RAM it may hold when ``directory`` is None;
    ``directory``, a local folder to keep it in (files that later runs reuse, bounded by the folder's free
    space) instead of RAM; ``decoded_max_side``, opt-in and images only: decoded training images are kept with
    their longer side capped at this many pixels (as FFCV does), which changes their pixels, so it needs
    ``mode=CacheMode.ON`` (with AUTO the pixels would depend on a measurement)."""

    mode: CacheMode = CacheMode.AUTO
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    directory: str | None = None
    decoded_max_side: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "mode", parse_cache_mode(self.mode, "CacheSettings.mode"))
        object.__setattr__(self, "memory_bytes", int_at_least("CacheSettings.memory_bytes", self.memory_bytes, 0))
        if self.directory is not None:
            if not isinstance(self.directory, (str, os.PathLike)):
                raise TypeError(f"CacheSettings.directory must be a path (str or os.PathLike) or None, "
                                f"got {type(self.directory).__name__}")
            directory = os.fspath(self.directory)
            if os.path.exists(directory) and not os.path.isdir(directory):
                raise ValueError(f"CacheSettings.directory must be a folder, {directory!r} is a file")
            object.__setattr__(self, "directory", directory)
        if self.decoded_max_side is not None:
            object.__setattr__(self, "decoded_max_side",
                               positive_int("CacheSettings.decoded_max_side", self.decoded_max_side))
            if self.mode is not CacheMode.ON:
                raise ValueError(f"CacheSettings.decoded_max_side changes the pixels of the decoded images, so it "
                                 f"needs mode=CacheMode.ON (so that every epoch has the same pixels), got "
                                 f"mode={self.mode.value!r}")


def cache_settings(value: CacheSettings | CacheMode | str) -> CacheSettings:
    """The Loader's ``cache`` argument: "auto", "on", "off", a ``CacheMode`` or ``CacheSettings``."""
    if isinstance(value, CacheSettings):
        return value
    if isinstance(value, (CacheMode, str)):
        return CacheSettings(mode=parse_cache_mode(value))
    raise TypeError(f"cache must be 'auto', 'on', 'off' or a feedline.loader.cache_policy.CacheSettings, "
                    f"got {type(value).__name__}")


def available_bytes(settings: CacheSettings, held: int = 0) -> int:
    """Bytes a cache may take under ``settings``: the RAM budget, or the free space of its directory (the
    nearest existing folder above it when not made yet) plus ``held``, what the cache's own files hold there."""
    if settings.directory is None:
        return settings.memory_bytes
    folder = os.path.abspath(settings.directory)
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    return shutil.disk_usage(folder).free + held


@dataclass(frozen=True)
class CacheDecision:
    """Whether ``what`` is cached, why (``reason``), and the figures behind it: ``recompute_s`` and ``read_s``
    (seconds for the same samples: recomputing them, reading them from the cache; None before measuring),
    ``bytes_needed`` and ``space_bytes`` (what the cache takes and what it may take), ``mode``."""

    use: bool
    reason: str
    what: str
    mode: str
    recompute_s: float | None = None
    read_s: float | None = None
    bytes_needed: int | None = None
    space_bytes: int | None = None
    measured: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def decide(*, what: str, recompute_s: float, read_s: float, bytes_needed: int, settings: CacheSettings,
           space_bytes: int) -> CacheDecision:
    """Cachew's rule: cache ``what`` only where recomputing it (``recompute_s``) costs more than reading it back
    (``read_s``, seconds for the same samples) and its ``bytes_needed`` fit ``space_bytes``; ``ON`` caches
    wherever it fits, ``OFF`` never."""
    recompute_s, read_s = _seconds("recompute_s", recompute_s), _seconds("read_s", read_s)
    bytes_needed = int_at_least("bytes_needed", bytes_needed, 0)
    space_bytes = int_at_least("space_bytes", space_bytes, 0)
    figures = dict(what=what, mode=settings.mode.value, recompute_s=recompute_s, read_s=read_s,
                   bytes_needed=bytes_needed, space_bytes=space_bytes)
    where = "RAM budget" if settings.directory is None else f"free space in {settings.directory}"
    fits = bytes_needed <= space_bytes
    costs = f"recomputing takes {recompute_s * 1e3:.3f} ms, reading the cache {read_s * 1e3:.3f} ms"
    room = f"{format_bytes(bytes_needed)} against {format_bytes(space_bytes)} of {where}"
    if settings.mode is CacheMode.OFF:
        return CacheDecision(False, f"not cached: cache='off' ({costs})", **figures)
    if not fits:
        return CacheDecision(False, f"not cached: it does not fit ({room})", **figures)
    if settings.mode is CacheMode.ON:
        return CacheDecision(True, f"cached: cache='on' and it fits ({room}; {costs})", **figures)
    if recompute_s > read_s:
        return CacheDecision(True, f"cached: {costs}, {recompute_s / max(read_s, 1e-12):.1f}x more to recompute, "
                                   f"and it fits ({room})", **figures)
    return CacheDecision(False, f"not cached: {costs}, so reading the cache would not pay "
                                f"(it would fit: {room})", **figures)


def pending(what: str, settings: CacheSettings) -> CacheDecision:
    """The decision before anything is measured: the cache fills during the first epoch (unless OFF) and is
    used from the next one if ``decide`` then says so."""
    if settings.mode is CacheMode.OFF:
        return CacheDecision(False, "not cached: cache='off'", what, settings.mode.value, measured=False)
    return CacheDecision(False, "not decided yet: the first epoch measures recomputing and reading the cache",
                         what, settings.mode.value, measured=False)
