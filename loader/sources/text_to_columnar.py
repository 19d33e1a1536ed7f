"""A one-time conversion of tabular text files to feedline's converted tables (``columnar``): every column an
integer (hex ids parsed) in the narrowest type that holds it, as fixed-size records, so that a streamed epoch
reads chunks with one ``pread`` each and never parses text again.

The files are read twice: once to find each column's range, once to write. Rows keep their order over the
files. With ``on_error="skip"`` bad lines are left out and listed in ``<out>/skipped.tsv``
(``file:line<TAB>reason``); with ``"raise"`` the first one stops the conversion, naming it.
``criteo("<out>")`` reads the result.

An input that changes between or during the passes could hand the second pass values the first never saw,
which a narrow type would wrap (300 stored as uint8 reads back as 44). So every value is checked against its
column's type before it is written, the inputs' content fingerprints must be the same after each pass, and
the second pass must write the rows the first counted; any of these failing stops the conversion, naming the
column and ``file:line`` or the file, and removes what was written.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...pipelines.tabular import TabularFiles
from .chunked import ChunkedTable
from .columnar import ColumnarWriter, narrowest
from .index_store import Fingerprint
from .table_rows import RowError


def convert(files: TabularFiles, out: str | os.PathLike, *, progress=None) -> dict:
    """Convert ``files`` (TSV, plain or gzip) into a converted table in the folder ``out``; returns a summary."""
    from .tsv import TsvFormat

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} must be a new or empty folder")
    table = ChunkedTable(files, TsvFormat(files.columns), cache_rows=0)
    fingerprints = [Fingerprint.of(p) for p in table.paths]
    names = [c.name for c in files.columns]
    low = np.zeros(len(names), dtype=np.int64)   # missing values are stored as 0
    high = np.zeros(len(names), dtype=np.int64)
    good = 0
    for _, ints, _ in _blocks(table, progress):
        if ints.size:
            low = np.minimum(low, ints.min(axis=0))
            high = np.maximum(high, ints.max(axis=0))
        good += ints.shape[0]
    _unchanged(table.paths, fingerprints, "between its two passes")
    dtypes = [narrowest(int(a), int(b)) for a, b in zip(low, high)]
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    writer = None
    try:
        writer = ColumnarWriter(out, names, dtypes)
        for rows, ints, missing in _blocks(table, progress):
            _check_ranges(table, names, dtypes, rows, ints)
            writer.write(ints, missing)
        _unchanged(table.paths, fingerprints, "during its second pass")
        if writer.rows != good:
            raise RowError(", ".join(table.paths), None, f"gave {writer.rows} good rows on the second pass of "
                                                         f"feedline convert and {good} on the first")
        writer.close({"sources": table.paths, "skipped": len(table.skipped)})
        if table.skipped:
            (out / "skipped.tsv").write_text("".join(f"{s.where}\t{s.reason}\n" for s in table.skipped))
    except BaseException:
        _remove(out, created, writer)
        raise
    return {"inputs": len(table.paths), "output": str(out), "rows": writer.rows, "skipped": len(table.skipped),
            "bytes_in": int(sum(os.path.getsize(p) for p in table.paths)),
            "bytes_out": int(sum(f.stat().st_size for f in out.iterdir()))}


def _blocks(table: ChunkedTable, progress):
    """Each chunk's good rows, in file order: (their row numbers, int64 values, missing flags), [rows, columns]."""
    for c in range(table.chunk_rows.size):
        first = int(table.first_row[c])
        numbers = np.arange(first, first + int(table.chunk_rows[c]))
        rows = table.read(numbers)
        keep = ~rows.bad
        names = list(rows.columns)
        ints = np.stack([rows.columns[n].values[keep] for n in names], axis=1)
        missing = np.stack([rows.columns[n].missing[keep] for n in names], axis=1)
        if progress is not None:
            progress(int(table.chunk_rows[c]))
        yield numbers[keep], ints, missing


def _check_ranges(table: ChunkedTable, names: list[str], dtypes: list[np.dtype], rows: np.ndarray,
                  ints: np.ndarray) -> None:
    """Every value fits its column's stored type (the range the first pass found)."""
    for j, (name, dtype) in enumerate(zip(names, dtypes)):
        info = np.iinfo(dtype)
        outside = np.flatnonzero((ints[:, j] < info.min) | (ints[:, j] > info.max))
        if outside.size:
            k = int(outside[0])
            file, line = table.where(int(rows[k])).rsplit(":", 1)
            raise RowError(file, int(line), f"column {name}: {int(ints[k, j])} is outside [{info.min}, {info.max}], "
                                            f"the range of the {dtype} the first pass of feedline convert chose for "
                                            f"it: the file changed while it was being converted")


def _unchanged(paths: list[str], fingerprints: list[Fingerprint], when: str) -> None:
    for path, before in zip(paths, fingerprints):
        try:
            now = Fingerprint.of(path)
        except OSError as e:
            raise RowError(path, None, f"cannot be read {when} of feedline convert: {e.strerror or e}") from None
        if now != before:
            raise RowError(path, None, f"changed {when} of feedline convert; convert it again once it is complete")


def _remove(out: Path, created: bool, writer) -> None:
    """Remove what a failed conversion wrote: the folder was new or empty, so every file in it (and the folder
    itself, if the conversion made it)."""
    for f in vars(writer).values() if writer is not None else ():
        if hasattr(f, "write") and hasattr(f, "close"):  # the writer's open files
            f.close()
    for entry in os.scandir(out):
        if entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
    if created:
        try:
            out.rmdir()
        except OSError:
            pass


__all__ = ["convert"]
