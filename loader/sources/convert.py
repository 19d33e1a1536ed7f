"""A one-time conversion of tabular text files to feedline's converted tables (``columnar``): every column an
integer (hex ids parsed) in the narrowest type that holds it, as fixed-size records, so that a streamed epoch
reads chunks with one ``pread`` each and never parses text again.

The files are read twice: once to find each column's range, once to write. Rows keep their order over the
files. With ``on_error="skip"`` bad lines are left out and listed in ``<out>/skipped.tsv``
(``file:line<TAB>reason``); with ``"raise"`` the first one stops the conversion, naming it.
``criteo("<out>")`` reads the result.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...pipelines.tabular import TabularFiles
from .chunked import ChunkedTable
from .columnar import ColumnarWriter, narrowest
from .tabular import RowError  # noqa: F401  (what a bad line raises)


def convert(files: TabularFiles, out: str | os.PathLike, *, progress=None) -> dict:
    """Convert ``files`` (TSV, plain or gzip) into a converted table in the folder ``out``; returns a summary."""
    from .tsv import TsvFormat

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} must be a new or empty folder")
    table = ChunkedTable(files, TsvFormat(files.columns), cache_rows=0)
    names = [c.name for c in files.columns]
    low = np.zeros(len(names), dtype=np.int64)   # missing values are stored as 0
    high = np.zeros(len(names), dtype=np.int64)
    for ints, _ in _blocks(table, progress):
        if ints.size:
            low = np.minimum(low, ints.min(axis=0))
            high = np.maximum(high, ints.max(axis=0))
    out.mkdir(parents=True, exist_ok=True)
    writer = ColumnarWriter(out, names, [narrowest(int(a), int(b)) for a, b in zip(low, high)])
    for ints, missing in _blocks(table, progress):
        writer.write(ints, missing)
    writer.close({"sources": table.paths, "skipped": len(table.skipped)})
    if table.skipped:
        (out / "skipped.tsv").write_text("".join(f"{s.where}\t{s.reason}\n" for s in table.skipped))
    return {"inputs": len(table.paths), "output": str(out), "rows": writer.rows, "skipped": len(table.skipped),
            "bytes_in": int(sum(os.path.getsize(p) for p in table.paths)),
            "bytes_out": int(sum(f.stat().st_size for f in out.iterdir()))}


def _blocks(table: ChunkedTable, progress):
    """Each chunk's good rows, in file order: (int64 values, missing flags), [rows, columns]."""
    for c in range(table.chunk_rows.size):
        first = int(table.first_row[c])
        rows = table.read(np.arange(first, first + int(table.chunk_rows[c])))
        keep = ~rows.bad
        names = list(rows.columns)
        ints = np.stack([rows.columns[n].values[keep] for n in names], axis=1)
        missing = np.stack([rows.columns[n].missing[keep] for n in names], axis=1)
        if progress is not None:
            progress(int(table.chunk_rows[c]))
        yield ints, missing


__all__ = ["convert"]
