"""What every tabular reader shares: its errors, the columns it returns, and what a bad row does.

Opening indexes the files without reading their rows, so ``num_rows`` counts every line (Parquet: row), bad
ones included, and a row's number is its place over the files. A row is checked when its chunk is first read:
with ``OnError.RAISE`` a bad row raises :class:`RowError` naming file and 1-based line (Parquet: row); with
``OnError.SKIP`` it keeps its number, is delivered as an invalid slot (``valid`` False in the batch, zeros in
its values), and is listed once, by where it is, in ``skipped`` (the table's ``SkipLog``). So no good row moves,
every good row is delivered exactly once whatever the order or sharding, and every rank's batches keep their
size. Whole-file problems (a missing or empty file, a truncated gzip file, a Parquet file without a declared
column) are found when the files are opened.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ...pipelines.on_error import OnError
from ..errors import DataError, Skipped
from ..skip_log import SkipLog


class RowError(DataError):
    """A bad row (or file): ``file`` and ``line`` (1-based; for Parquet the row; None for a whole file)."""

    def __init__(self, file: str, line: int | None, reason: str):
        super().__init__(file if line is None else f"{file}:{line}", reason)
        self.file = file
        self.line = line

    def __reduce__(self):
        return type(self), (self.file, self.line, self.reason)


class MissingFileError(RowError, FileNotFoundError):
    def __init__(self, file: str, line: None = None, reason: str = "file does not exist"):
        super().__init__(file, None, reason)


class ScalarColumn(NamedTuple):
    values: np.ndarray   # int64 or float64, one per row; meaningless where missing
    missing: np.ndarray  # bool


class ListColumn(NamedTuple):
    offsets: np.ndarray  # int64 [rows + 1]
    values: np.ndarray   # int64; a missing list is empty


class Rows(NamedTuple):
    columns: dict   # name -> ScalarColumn | ListColumn, one row per requested row
    bad: np.ndarray  # bool per requested row: a bad row, its values zeros and missing (``OnError.SKIP``)


class TabularReader(Protocol):
    """An opened table. Its rows are checked as they are read: ``read`` raises ``RowError`` for a bad row, or
    (``OnError.SKIP``) marks it in ``Rows.bad`` and lists it in ``skipped`` the first time it is met."""

    num_rows: int
    skipped: list[Skipped]

    def read(self, rows: np.ndarray) -> Rows:
        """The given rows (0-based over all files, any order, repeats allowed), every declared column."""
        ...

    def where(self, row: int) -> str:
        """``file:line`` of a row (Parquet: ``file:row``)."""
        ...


def bad_row(on_error: OnError, skips: SkipLog, file: str, line: int | None, reason: str) -> None:
    """Raise a RowError for the row, or (``OnError.SKIP``) list it in ``skips`` (once: by where it is)."""
    if on_error is OnError.RAISE:
        raise RowError(file, line, reason)
    skips.add(Skipped(file if line is None else f"{file}:{line}", reason))


def check_rows(rows: np.ndarray, num_rows: int) -> np.ndarray:
    rows = np.asarray(rows)
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise TypeError(f"rows must be a 1-D integer array, got {rows.dtype} with shape {rows.shape}")
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise IndexError(f"rows must lie in [0, {num_rows}), got values in [{rows.min()}, {rows.max()}]")
    return rows.astype(np.int64, copy=False)
