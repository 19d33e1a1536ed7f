"""Byte counts as people read them (B, KiB, MiB, GiB), in the cache's decisions and in placement's reasons and
tables."""
from __future__ import annotations


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
