"""The Criteo click-log pipeline (Kaggle Display Advertising / Criteo 1TB layout) on the tabular definition.

Each row: ``label`` (0/1), ``I1``..``I13`` integer counts, ``C1``..``C26`` categorical ids written as 32-bit
hexadecimal strings; an empty field is a missing value. TSV files (plain or gzip) hold the 40 fields in that
order; Parquet files hold columns with those names (``C`` columns as hex strings or as integers).

Outputs per row:

- ``label``: float32.
- ``dense``: float32 [13]: missing -> 0, negatives clipped to 0, then ``log1p`` (``feedline.ops.normalize_dense``).
- ``sparse``: 26 keys ``C1``..``C26`` with one id each: the categorical value ``int(hex, 16)`` as int64, hashed
  with ``feedline.ops.hash_buckets`` (MurmurHash3_x86_32 of its 8 little-endian bytes) with seed ``j`` for
  ``C{j+1}``, modulo that feature's table size. A missing value is hashed as the int64 value -1
  (``MISSING_ID``), which no 32-bit hex id can equal.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..ops import MAX_NUM_BUCKETS
from .spec import PipelineSpec
from .tabular import (Categorical, Column, ColumnKind, Dense, FileFormat, OnError, Schema,
                      TabularFiles, tabular)
from .validate import int_in

NUM_DENSE = 13
NUM_CATEGORICAL = 26
DENSE_NAMES = tuple(f"I{i}" for i in range(1, NUM_DENSE + 1))
CATEGORICAL_NAMES = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
DEFAULT_TABLE_SIZE = 1 << 20
PARQUET_SUFFIXES = (".parquet", ".pq")


def criteo(paths: str | os.PathLike | Sequence[str | os.PathLike], *,
           table_sizes: int | Sequence[int] | None = None, format: str = "auto",
           on_error: str | OnError = "raise") -> PipelineSpec:
    """The Criteo pipeline over ``paths`` (rows numbered over the files in the order given).

    ``table_sizes``: buckets per categorical feature: one int for all 26, 26 ints, or None for
    ``DEFAULT_TABLE_SIZE``. ``format``: ``"tsv"``, ``"parquet"`` or ``"auto"`` (Parquet for names ending in
    ``.parquet``/``.pq``, else TSV). ``on_error``: ``"raise"`` on the first bad row, or ``"skip"`` bad rows
    (each delivered as an invalid slot, ``valid`` False, and listed once in ``Loader.skipped``).
    """
    files = TabularFiles(paths, _format(paths, format), _columns(), on_error)
    sizes = _table_sizes(table_sizes)
    features = tuple(Dense(name) for name in DENSE_NAMES) + tuple(
        Categorical(name, size, seed=j) for j, (name, size) in enumerate(zip(CATEGORICAL_NAMES, sizes)))
    return tabular(Schema("label", features), files, name="criteo")


def _columns() -> tuple[Column, ...]:
    return ((Column("label", ColumnKind.INT),) + tuple(Column(n, ColumnKind.INT) for n in DENSE_NAMES)
            + tuple(Column(n, ColumnKind.HEX) for n in CATEGORICAL_NAMES))


def _format(paths, format: str) -> FileFormat:
    if format != "auto":
        if getattr(format, "value", format) not in ("tsv", "parquet", "columnar"):  # (CSV: use tabular())
            raise ValueError(f"format must be 'auto', 'tsv', 'parquet' or 'columnar', got {format!r}")
        return FileFormat(format)
    names = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths) if isinstance(paths, Sequence) else []
    if not names:
        raise TypeError(f"paths must be a path or a non-empty sequence of paths, got {paths!r}")
    kinds = {FileFormat.COLUMNAR if os.path.isdir(p) else
             FileFormat.PARQUET if os.fspath(p).lower().endswith(PARQUET_SUFFIXES) else FileFormat.TSV
             for p in names if isinstance(p, (str, os.PathLike))}
    if len(kinds) > 1:
        raise ValueError(f"paths mix formats (TSV, Parquet, converted folders) ({[os.fspath(p) for p in names][:4]}...); "
                         f"give one format, or pass format= explicitly")
    return kinds.pop() if kinds else FileFormat.TSV


def _table_sizes(table_sizes) -> tuple[int, ...]:
    if table_sizes is None:
        return (DEFAULT_TABLE_SIZE,) * NUM_CATEGORICAL
    if isinstance(table_sizes, (int, np.integer)) and not isinstance(table_sizes, bool):
        sizes = (int(table_sizes),) * NUM_CATEGORICAL
    elif isinstance(table_sizes, (Sequence, np.ndarray)) and not isinstance(table_sizes, (str, bytes)):
        sizes = tuple(table_sizes)
        if len(sizes) != NUM_CATEGORICAL:
            raise ValueError(f"table_sizes must hold {NUM_CATEGORICAL} sizes (one per C1..C26), got {len(sizes)}")
    else:
        raise TypeError(f"table_sizes must be None, an int or a sequence of {NUM_CATEGORICAL} ints, "
                        f"got {type(table_sizes).__name__}")
    for name, size in zip(CATEGORICAL_NAMES, sizes):
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"table_sizes entry for {name} must be an int, got {type(size).__name__} {size!r}")
        int_in(f"table_sizes entry for {name}", size, 1, MAX_NUM_BUCKETS)
    return tuple(int(s) for s in sizes)
