"""Numbers as people read them in a placement's reasons and tables (milliseconds and bytes), and the tables."""
from __future__ import annotations

from ..byte_units import format_bytes  # re-exported: placement's reasons and tables take it from here


def format_ms(ms: float) -> str:
    return f"{ms:.2g}" if ms < 10 else f"{ms:,.0f}"


def text_columns(rows: list[tuple[str, ...]], numeric: set[int], *, free_last: bool = False) -> list[str]:
    """``rows`` of cells (the first: the headings) as lines of aligned columns, those of ``numeric`` to the right,
    with a rule under the headings. ``free_last``: the last column (free text) is not padded, and its rule is as
    long as its heading."""
    padded = len(rows[0]) - 1 if free_last else len(rows[0])
    widths = [max(len(row[i]) for row in rows) for i in range(padded)]
    lines = ["  ".join([c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
                       + list(row[padded:])).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths + [len(rows[0][-1])] * (len(rows[0]) - padded)))
    return lines
