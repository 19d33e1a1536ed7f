"""Parquet files as chunks of rows, converted when read.

Each row group is one group of ``CHUNK_ROWS``-row chunks, read front to back with pyarrow's
``ParquetFile.iter_batches`` (one row group at a time, so a large row group never sits in memory whole); the
index is the files' metadata. The declared columns must be present (checked when the files are opened).

Column types accepted: ``INT``: integers, or floats holding whole numbers (pandas writes an int column with
missing values as float64 with NaN); ``FLOAT``: any number; ``HEX``: hex strings or integers; ``STRING``:
strings or binary, kept as the key that hashes as the UTF-8 bytes do (see ``text_parse``); ``INT_LIST``: lists
of integers. Null, NaN and the empty string are missing values; +-inf is a bad row.
"""
from __future__ import annotations

import threading

import numpy as np

from ...pipelines.tabular import Column, ColumnKind
from .chunked import ChunkIndex, RowsChunk
from .table_rows import ListColumn, RowError, ScalarColumn
from .text_parse import OK, OUT_OF_RANGE, hex_strings, string_keys

_INT64_MAX = float(2**63)
CHUNK_ROWS = 1 << 14


class ParquetFormat:
    def __init__(self, columns: tuple[Column, ...]):
        self.columns = columns
        self._cursors: dict[str, _GroupCursor] = {}
        self._lock = threading.Lock()

    def index(self, path: str) -> ChunkIndex:
        parquet = _open(path)
        names = parquet.schema_arrow.names
        absent = [c.name for c in self.columns if c.name not in names]
        if absent:
            raise RowError(path, None, f"has no column(s) {absent}; its columns are {names}")
        starts, rows, groups, lines = [], [], [], []
        first = 1
        for g in range(parquet.metadata.num_row_groups):
            n = parquet.metadata.row_group(g).num_rows
            for a in range(0, n, CHUNK_ROWS):
                starts.append(a)
                rows.append(min(CHUNK_ROWS, n - a))
                groups.append(g)
                lines.append(first + a)
            first += n
        if not rows:
            return ChunkIndex.empty()
        starts_, rows_ = np.asarray(starts, dtype=np.int64), np.asarray(rows, dtype=np.int64)
        return ChunkIndex(starts_, starts_ + rows_, np.asarray(lines, dtype=np.int64), rows_,
                          np.asarray(groups, dtype=np.int64))

    def load(self, path: str, index: ChunkIndex, chunk: int) -> RowsChunk:
        with self._lock:
            cursor = self._cursors.get(path)
            if cursor is None:
                cursor = self._cursors[path] = _GroupCursor(path, [c.name for c in self.columns])
        table = cursor.rows(int(index.groups[chunk]), int(index.starts[chunk]), int(index.stops[chunk]))
        n = table.num_rows
        problems = np.full(n, -1, dtype=np.int64)
        reasons: dict[int, str] = {}
        columns = {}
        for j, column in enumerate(self.columns):
            data, bad, why = _convert(path, column, table.column(column.name).combine_chunks())
            first = bad & (problems < 0)
            problems[first] = j
            for row in np.flatnonzero(first).tolist():
                reasons[row] = f"column {column.name}: {why(row)}"
            columns[column.name] = data
        bad = problems >= 0
        for name, data in columns.items():
            if isinstance(data, ScalarColumn) and bad.any():
                data.values[bad] = 0
        return RowsChunk(columns, bad, reasons)


def _open(path: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise RowError(path, None, f"is not a readable Parquet file: {e}") from None


class _GroupCursor:
    """Reads one file's row groups front to back; asked for rows behind it, it starts the group again."""

    def __init__(self, path: str, names: list[str]):
        self.path, self.names = path, names
        self.file = _open(path)
        self.lock = threading.Lock()
        self.group, self.position, self.batches, self.pending = None, 0, None, None

    def rows(self, group: int, start: int, stop: int):
        import pyarrow as pa

        with self.lock:
            if group != self.group or start < self.position:
                self.group, self.position, self.pending = group, 0, None
                self.batches = self.file.iter_batches(batch_size=CHUNK_ROWS, row_groups=[group],
                                                      columns=self.names)
            parts = []
            try:
                while self.position < stop:
                    if self.pending is None or not self.pending.num_rows:
                        self.pending = next(self.batches)
                    skip = max(0, start - self.position)
                    take = min(self.pending.num_rows, stop - self.position)
                    if take > skip:
                        parts.append(self.pending.slice(skip, take - skip))
                    self.pending = self.pending.slice(take)
                    self.position += take
            except StopIteration:
                raise RowError(self.path, None, f"row group {group} ends before row {stop} its metadata "
                                                f"promises") from None
            except (pa.ArrowException, OSError) as e:
                raise RowError(self.path, None, f"cannot be read: {e}") from None
            return pa.Table.from_batches(parts) if parts else pa.Table.from_batches([], schema=None)


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

    if kind is ColumnKind.STRING:
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t)):
            raise wrong_type("strings")
        offsets, data = _arrow_strings(array)
        keys = np.empty(len(array), dtype=np.int64)
        string_keys(offsets, data, column.hash_seed, keys)
        missing = null | (np.diff(offsets) == 0)
        keys[missing] = 0
        return ScalarColumn(keys, missing), column.required & missing, \
            lambda row: "is empty, and a value is required"
    if kind is ColumnKind.HEX and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        values, code, missing = _hex_strings(array, null)
        return ScalarColumn(values, missing), (code != OK) | (column.required & missing), \
            lambda row: _describe(code[row], array[row].as_py(), "a hexadecimal integer")
    if kind is ColumnKind.FLOAT:
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise wrong_type("a number")
        values = (pc.fill_null(array, 0) if array.null_count else array).to_numpy(zero_copy_only=False)
        values = values.astype(np.float64)
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

    raw = (pc.fill_null(array, 0) if array.null_count else array).to_numpy(zero_copy_only=False)
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


def _arrow_strings(array) -> tuple[np.ndarray, np.ndarray]:
    """An Arrow string or binary array's offsets (int64, one per string and one more) and bytes."""
    _, offsets_buffer, data_buffer = array.buffers()
    wide = str(array.type) in ("large_string", "large_binary")
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
    offsets = offsets[array.offset:array.offset + len(array) + 1].astype(np.int64)
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    return offsets, data


def _hex_strings(array, null: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values, status codes and missing mask of a string array of hex numbers, parsed natively."""
    offsets, data = _arrow_strings(array)
    missing = null | (np.diff(offsets) == 0)
    values = np.empty(len(array), dtype=np.int64)
    code = np.empty(len(array), dtype=np.int8)
    hex_strings(offsets, data, values, code)
    values[missing] = 0
    code[missing] = OK
    return values, code, missing


def _describe(code: int, value, what: str) -> str:
    if code == OK:
        return "is empty, and a value is required"
    return f"{value!r} is out of int64 range" if code == OUT_OF_RANGE else f"{value!r} is not {what}"
