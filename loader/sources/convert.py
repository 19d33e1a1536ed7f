"""A one-time conversion of tabular text files to Parquet that reads faster: every column already an integer
(hex ids parsed), in small row groups, so that a streamed epoch never parses text again.

One output file per input file, ``<name>.parquet`` in the output folder; rows keep their order, and
``criteo("<out>/*.parquet")`` reads them (its hex columns take integers in Parquet). With
``on_error="skip"`` bad lines are left out and listed in ``<out>/skipped.tsv`` (``file:line<TAB>reason``);
with ``"raise"`` the first one stops the conversion, naming it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ...pipelines.tabular import ColumnKind, TabularFiles
from .chunked import ChunkedTable
from .tabular import RowError  # noqa: F401  (what a bad line raises)

ROW_GROUP_ROWS = 1 << 16


def convert(files: TabularFiles, out: str | os.PathLike, *, row_group_rows: int = ROW_GROUP_ROWS,
            progress=None) -> dict:
    """Convert ``files`` (TSV, plain or gzip) into Parquet files in the folder ``out``; returns a summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .tsv import TsvFormat

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} must be a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    table = ChunkedTable(files, TsvFormat(files.columns), cache_rows=0)
    names = [c.name for c in files.columns]
    types = {c.name: (pa.int64() if c.kind is not ColumnKind.FLOAT else pa.float64()) for c in files.columns}
    schema = pa.schema([(n, types[n]) for n in names])
    written, outputs = 0, []
    for f, path in enumerate(table.paths):
        target = out / (Path(path).name.split(".")[0] + ".parquet")
        if target.exists():
            target = out / (Path(path).name.replace(".", "_") + ".parquet")
        chunks = np.flatnonzero(table.file_of == f)
        with pq.ParquetWriter(target, schema, compression="zstd") as writer:
            pending: list = []
            pending_rows = 0
            for c in chunks.tolist():
                first = int(table.first_row[c])
                rows = table.read(np.arange(first, first + int(table.chunk_rows[c])))
                keep = ~rows.bad
                arrays = {n: _arrow(rows.columns[n], keep, types[n]) for n in names}
                pending.append(pa.table(arrays, schema=schema))
                pending_rows += int(keep.sum())
                if pending_rows >= row_group_rows:
                    writer.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
                    written += pending_rows
                    pending, pending_rows = [], 0
                if progress is not None:
                    progress(int(table.chunk_rows[c]))
            if pending:
                writer.write_table(pa.concat_tables(pending), row_group_size=row_group_rows)
                written += pending_rows
        outputs.append(str(target))
    if table.skipped:
        (out / "skipped.tsv").write_text("".join(f"{s.where}\t{s.reason}\n" for s in table.skipped))
    return {"inputs": len(table.paths), "outputs": outputs, "rows": written, "skipped": len(table.skipped),
            "bytes_in": int(sum(os.path.getsize(p) for p in table.paths)),
            "bytes_out": int(sum(os.path.getsize(p) for p in outputs))}


def _arrow(column, keep: np.ndarray, type_):
    import pyarrow as pa

    values, missing = column.values[keep], column.missing[keep]
    return pa.array(values, type=type_, mask=missing)


__all__ = ["convert", "RowError"]
