"""One number format for every table the commands print."""
from __future__ import annotations

import math


def format_value(value) -> str | None:
    """One number format for every table: integers with thousands separators; other numbers with three
    significant digits below 1,000 and as whole numbers with separators from 1,000; lists item by item; a dict of
    plain values as ``key value`` pairs. None for what a table row cannot show (nested containers)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        items = [format_value(v) if not isinstance(v, (list, tuple, dict)) else None for v in value]
        return None if None in items else "  ".join(items)
    if isinstance(value, dict):
        items = {k: format_value(v) if not isinstance(v, (list, tuple, dict)) else None for k, v in value.items()}
        return None if None in items.values() else ", ".join(f"{k} {v}" for k, v in items.items())
    return str(value)


def format_table(result: dict) -> str:
    """``key  value`` rows (:func:`format_value`), then the ``notes``, one per line."""
    rows = [(k, format_value(v)) for k, v in result.items() if k != "notes"]
    rows = [(k, v) for k, v in rows if v is not None]
    width = max((len(k) for k, _ in rows), default=0)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    notes = result.get("notes") or []
    if notes:
        lines += ["notes"] + [f"  - {note}" for note in notes]
    return "\n".join(lines)
