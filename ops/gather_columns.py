"""Gathering the rows a batch needs out of blocks of typed columns, straight into the batch's arrays.

A :class:`ColumnBlock` describes the scalar columns of a run of rows as they lie in memory, without copying
them: values inside one byte buffer (each column an integer or float type, row ``r`` at element
``start + r * step`` of the buffer viewed as that type: a column-major chunk has ``step`` 1, a row-major
int64 block has ``step`` = its column count) and missing flags inside another (one byte per row, or one
bit per row, or none).

``gather_columns`` writes each picked column to one of three outputs, converting as the feature pipelines
read them: the label (float32), a dense row (float32, NaN where missing) or an id row (int64,
``missing_id`` where missing). ``gather_raw`` copies columns as they are (int64 or float64 and a missing
mask). ``group_by_chunk`` splits a batch's rows by the chunk holding them. Each runs as a GIL-free numba
kernel where numba is installed, else in NumPy (the reference the kernels are tested against); both give
the same bits.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._native import kernels

CODES = {np.dtype(t): code for code, t in enumerate(
    (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64, np.float32, np.float64))}
DTYPES = {code: dtype for dtype, code in CODES.items()}
NO_FLAGS, BYTE_FLAGS, BIT_FLAGS = range(3)
LABEL, DENSE, IDS = range(3)
_EMPTY_ROWS = np.zeros((0, 0), dtype=np.float32)


class ColumnBlock(NamedTuple):
    """``layout[c]`` = (type code, start, step, flag kind, flag start, flag step) of column ``c``: its values
    are ``data.view(DTYPES[code])[start + r * step]`` for rows ``r < rows``; flag kind ``BYTE_FLAGS``: missing
    where ``flags[flag_start + r * flag_step] != 0``; ``BIT_FLAGS``: where bit ``b = flag_start + r * flag_step``
    of ``flags`` (bit ``b & 7`` of byte ``b >> 3``) is set; ``NO_FLAGS``: never. ``data`` and ``flags`` are 1-D
    uint8, ``data`` a whole number of 8-byte words long."""

    data: np.ndarray
    flags: np.ndarray
    layout: np.ndarray  # int64 [columns, 6]
    rows: int

    @classmethod
    def row_major(cls, values: np.ndarray, missing: np.ndarray) -> ColumnBlock:
        """The block of a C-contiguous [rows, columns] array (int64 or float64) and its bool missing mask."""
        rows, columns = values.shape
        code = CODES[values.dtype]
        layout = np.array([(code, c, columns, BYTE_FLAGS, c, columns) for c in range(columns)],
                          dtype=np.int64).reshape(columns, 6)
        return cls(values.reshape(-1).view(np.uint8), missing.reshape(-1).view(np.uint8), layout, rows)


def _values(block: ColumnBlock, column: int, local: np.ndarray) -> np.ndarray:
    code, start, step = (int(v) for v in block.layout[column, :3])
    return block.data.view(DTYPES[code])[start + local * step]


def _missing(block: ColumnBlock, column: int, local: np.ndarray) -> np.ndarray:
    kind, first, step = (int(v) for v in block.layout[column, 3:])
    if kind == BYTE_FLAGS:
        return block.flags[first + local * step] != 0
    if kind == BIT_FLAGS:
        bits = first + local * step
        return (block.flags[bits >> 3] >> (bits & 7).astype(np.uint8)) & 1 != 0
    return np.zeros(local.shape, dtype=bool)


def gather_columns(block: ColumnBlock, picks: np.ndarray, local: np.ndarray, positions: np.ndarray, *,
                   missing_id: int, label: np.ndarray | None = None, dense: np.ndarray | None = None,
                   ids: np.ndarray | None = None) -> None:
    """For each ``(column, target, row)`` of ``picks`` (int64 [J, 3]): row ``local[i]`` of the block's
    ``column`` into element ``positions[i]`` of ``label`` (target ``LABEL``, float32 [B]), ``dense[row]``
    (``DENSE``, float32 [R, B], NaN where missing) or ``ids[row]`` (``IDS``, int64 [K, B], ``missing_id`` where
    missing). The outputs' rows must be C-contiguous."""
    label = np.zeros(0, np.float32) if label is None else label
    dense = _EMPTY_ROWS if dense is None else dense
    ids = _EMPTY_ROWS.astype(np.int64) if ids is None else ids
    native = kernels("gather")
    if native is not None:
        native.gather_columns(block.data, block.flags, block.layout, picks, local, positions, np.int64(missing_id),
                              label, dense, ids)
        return
    for column, target, row in picks.tolist():
        values = _values(block, column, local)
        if target == LABEL:
            label[positions] = values.astype(np.float32)
            continue
        missing = _missing(block, column, local)
        if target == DENSE:
            dense[row, positions] = np.where(missing, np.float32(np.nan), values.astype(np.float32))
        else:
            ids[row, positions] = np.where(missing, np.int64(missing_id), values.astype(np.int64))


def gather_raw(block: ColumnBlock, int_columns: np.ndarray, float_columns: np.ndarray, local: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows ``local`` of the columns as stored: int64 [n, I], float64 [n, F] and missing bool [n, I + F]."""
    n = local.shape[0]
    ints = np.empty((n, int_columns.shape[0]), dtype=np.int64)
    floats = np.empty((n, float_columns.shape[0]), dtype=np.float64)
    missing = np.empty((n, int_columns.shape[0] + float_columns.shape[0]), dtype=bool)
    native = kernels("gather")
    if native is not None:
        native.gather_raw(block.data, block.flags, block.layout, int_columns, float_columns, local, ints, floats,
                          missing)
        return ints, floats, missing
    for j, c in enumerate(int_columns.tolist()):
        ints[:, j] = _values(block, c, local)
        missing[:, j] = _missing(block, c, local)
    for j, c in enumerate(float_columns.tolist()):
        floats[:, j] = _values(block, c, local)
        missing[:, int_columns.shape[0] + j] = _missing(block, c, local)
    return ints, floats, missing


def group_by_chunk(rows: np.ndarray, first_row: np.ndarray, *, max_groups: int = 64
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` (int64, any order) grouped by chunk (``first_row``: the chunks' first rows, increasing, the
    first 0): ``(chunks, bounds, local, positions)``: group ``g`` is chunk ``chunks[g]``, holding entries
    ``bounds[g]:bounds[g + 1]`` of ``local`` (the row within its chunk) and ``positions`` (where the row is in
    ``rows``). Groups come in order of first appearance and keep the rows' order within them."""
    n = rows.shape[0]
    native = kernels("gather")
    if native is not None:
        chunks = np.empty(max_groups, dtype=np.int64)
        bounds = np.empty(max_groups + 1, dtype=np.int64)
        local = np.empty(n, dtype=np.int64)
        positions = np.empty(n, dtype=np.int64)
        groups = native.group_by_chunk(rows, first_row, chunks, bounds, local, positions)
        if groups >= 0:
            return chunks[:groups], bounds[:groups + 1], local, positions
    chunk_of = np.searchsorted(first_row, rows, side="right") - 1
    unique, first_seen = np.unique(chunk_of, return_index=True)
    rank = np.empty(unique.size, dtype=np.int64)
    rank[np.argsort(first_seen, kind="stable")] = np.arange(unique.size)
    group = rank[np.searchsorted(unique, chunk_of)]
    positions = np.argsort(group, kind="stable").astype(np.int64)
    chunks = unique[np.argsort(first_seen, kind="stable")].astype(np.int64)
    bounds = np.zeros(chunks.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(group, minlength=chunks.size), out=bounds[1:])
    local = rows[positions] - first_row[chunk_of[positions]]
    return chunks, bounds, local.astype(np.int64), positions
