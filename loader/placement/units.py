"""Numbers as people read them in a placement's reasons and tables: milliseconds and bytes."""
from __future__ import annotations


def format_ms(ms: float) -> str:
    return f"{ms:.2g}" if ms < 10 else f"{ms:,.0f}"


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
