"""Rows of Parquet files by row number.

Opening reads the declared columns of every file once into NumPy arrays (Parquet has no cheap random row
access, so the columns live in memory), converting and checking them as it goes: a bad row raises or is
skipped, and ``num_rows`` counts good rows only. ``read`` is then a gather.

Column types accepted: ``INT``: integers, or floats holding whole numbers (pandas writes an int column with
missing values as float64 with NaN); ``FLOAT``: any number; ``HEX``: hex strings or integers; ``INT_LIST``:
lists of integers. Null, NaN and the empty string are missing values; +-inf is a bad row.
"""
from __future__ import annotations

import os

import numpy as np

from ...pipelines.tabular import Column, ColumnKind, OnError, TabularFiles
from ..errors import Skipped
from .tabular import bad_row, ListColumn, MissingFileError, RowError, ScalarColumn, check_rows
from .tsv_parse import NOT_NUMBER, OK, PAD, parse_hex

_INT64_MAX = float(2**63)


class ParquetSource:
    def __init__(self, files: TabularFiles):
        self.columns = files.columns
        self.on_error = files.on_error
        self.skipped: list[Skipped] = []
        parts = [self._load(path) for path in files.paths]
        parts = [p for p in parts if p is not None]
        self.num_rows = sum(p[0] for p in parts)
        if self.num_rows == 0:
            raise RowError(", ".join(files.paths), None, f"no good rows ({len(self.skipped)} skipped)")
        self._columns = {c.name: _concat([p[1][c.name] for p in parts]) for c in self.columns}

    def __len__(self) -> int:
        return self.num_rows

    def _bad(self, path: str, line: int | None, reason: str) -> None:
        bad_row(self.on_error, self.skipped, path, line, reason)

    def _load(self, path: str):
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not os.path.isfile(path):
            raise MissingFileError(path)
        try:
            parquet = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise RowError(path, None, f"is not a readable Parquet file: {e}") from None
        names = parquet.schema_arrow.names
        absent = [c.name for c in self.columns if c.name not in names]
        if absent:
            raise RowError(path, None, f"has no column(s) {absent}; its columns are {names}")
        table = parquet.read(columns=[c.name for c in self.columns])
        if table.num_rows == 0:
            self._bad(path, None, "file is empty")
            return None
        converted, problems = {}, np.zeros(table.num_rows, dtype=np.int64) - 1
        reasons: dict[int, str] = {}
        for j, column in enumerate(self.columns):
            array = table.column(column.name).combine_chunks()
            converted[column.name], bad, why = _convert(path, column, array)
            first = bad & (problems < 0)
            problems[first] = j
            for row in np.flatnonzero(first)[:None if self.on_error is OnError.SKIP else 1].tolist():
                reasons[row] = f"column {column.name}: {why(row)}"
        bad_rows = np.flatnonzero(problems >= 0)
        for row in bad_rows.tolist():
            self._bad(path, row + 1, reasons[row])
        good = problems < 0
        if bad_rows.size:
            converted = {name: _take(col, np.flatnonzero(good)) for name, col in converted.items()}
        return int(good.sum()), converted

    def read(self, rows: np.ndarray) -> dict[str, ScalarColumn | ListColumn]:
        rows = check_rows(rows, self.num_rows)
        return {name: _take(col, rows) for name, col in self._columns.items()}


def _convert(path: str, column: Column, array):
    """(column data, bad-row mask, reason(row)) for one Arrow array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, t = column.kind, array.type
    null = array.is_null().to_numpy(zero_copy_only=False) if array.null_count else np.zeros(len(array), bool)

    def wrong_type(expected: str):
        return RowError(path, None, f"column {column.name} has type {t}, expected {expected}")

    if kind is ColumnKind.INT_LIST:
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(t.value_type):
            raise wrong_type("a list of integers")
        array = pc.fill_null(array, pa.scalar([], type=t))
        offsets = np.asarray(array.offsets, dtype=np.int64)
        flat = array.values
        values, bad_values, _ = _integers(flat, np.zeros(len(flat), bool))
        if flat.null_count:
            bad_values |= flat.is_null().to_numpy(zero_copy_only=False)
        per_row = np.add.reduceat(np.append(bad_values, False).astype(np.int64), offsets[:-1]) > 0
        per_row &= np.diff(offsets) > 0
        values = values[offsets[0]:offsets[-1]]
        return ListColumn(offsets - offsets[0], values), per_row, \
            lambda row: "a list element is null or out of int64 range"

    if kind is ColumnKind.HEX and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        values, code, missing = _hex_strings(array, null)
        return ScalarColumn(values, missing), (code != OK) | (column.required & missing), \
            lambda row: _describe(code[row], array[row].as_py(), "a hexadecimal integer")
    if kind is ColumnKind.FLOAT:
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise wrong_type("a number")
        values = pc.fill_null(array, 0).to_numpy(zero_copy_only=False).astype(np.float64)
        missing = null | np.isnan(values)
        bad = np.isinf(values) | (column.required & missing)
        return ScalarColumn(values, missing), bad, lambda row: (
            "is empty, and a value is required" if missing[row] else f"{values[row]!r} is not a finite number")
    if not (pa.types.is_integer(t) or (kind is ColumnKind.INT and pa.types.is_floating(t))):
        raise wrong_type("integers" if kind is ColumnKind.INT else "hex strings or integers")
    values, bad, missing = _integers(array, null)
    bad |= column.required & missing
    return ScalarColumn(values, missing), bad, lambda row: (
        "is empty, and a value is required" if missing[row] else
        f"{array[row].as_py()!r} is not an integer within int64 range")


def _integers(array, null: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int64 values, bad mask, missing mask of an integer or whole-float Arrow array."""
    import pyarrow as pa
    import pyarrow.compute as pc

    raw = pc.fill_null(array, 0).to_numpy(zero_copy_only=False)
    missing = null.copy()
    if pa.types.is_floating(array.type):
        raw = raw.astype(np.float64)
        missing |= np.isnan(raw)
        finite = np.isfinite(raw)
        bad = ~missing & (~finite | (raw != np.floor(np.where(finite, raw, 0))) | (np.abs(raw) >= _INT64_MAX))
        values = np.where(bad | missing, 0, raw).astype(np.int64)
        return values, bad, missing
    if raw.dtype == np.uint64:
        bad = raw > np.uint64(2**63 - 1)
        return np.where(bad, 0, raw).astype(np.int64), bad, missing
    return raw.astype(np.int64), np.zeros(raw.size, bool), missing


def _hex_strings(array, null: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values, status codes and missing mask of a string array of hex numbers, parsed vectorised."""
    _, offsets_buffer, data_buffer = array.buffers()
    offset_type = np.int64 if str(array.type) == "large_string" else np.int32
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[array.offset:array.offset + len(array) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    buf = np.zeros(PAD + data.size + 8, dtype=np.uint8)  # room before the first and after the last field
    buf[PAD:PAD + data.size] = data
    start = offsets[:-1].astype(np.int64) + PAD
    end = offsets[1:].astype(np.int64) + PAD
    end = np.where(null, start, end)
    values, code = parse_hex(buf, start, end, check=True)
    missing = end == start
    values[missing] = 0
    code[missing] = OK
    # A byte below 0x20 cannot be part of a hex digit string; parse_hex assumes none are there.
    low = np.flatnonzero(data < 0x20)
    if low.size:
        code[np.searchsorted(offsets[1:].astype(np.int64), low, side="right")] = NOT_NUMBER
    return values, code, missing


def _describe(code: int, value, what: str) -> str:
    if code == OK:
        return "is empty, and a value is required"
    return f"{value!r} is not {what}" if code == NOT_NUMBER else f"{value!r} is out of int64 range"


def _take(col, rows: np.ndarray):
    if isinstance(col, ScalarColumn):
        return ScalarColumn(col.values[rows], col.missing[rows])
    lengths = (col.offsets[1:] - col.offsets[:-1])[rows]
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = np.repeat(col.offsets[:-1][rows] - offsets[:-1], lengths)
    return ListColumn(offsets, col.values[starts + np.arange(offsets[-1])])


def _concat(parts: list):
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], ScalarColumn):
        return ScalarColumn(np.concatenate([p.values for p in parts]), np.concatenate([p.missing for p in parts]))
    shifts = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
    offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts)])
    return ListColumn(offsets.astype(np.int64), np.concatenate([p.values for p in parts]))
