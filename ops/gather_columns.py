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

import functools
from typing import NamedTuple

import numpy as np

from ._native import kernels

CODES = {np.dtype(t): code for code, t in enumerate(
    (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64, np.float32, np.float64))}
DTYPES = {code: dtype for dtype, code in CODES.items()}
NO_FLAGS, BYTE_FLAGS, BIT_FLAGS = range(3)
LABEL, DENSE, IDS = range(3)
_EMPTY_ROWS = np.zeros((0, 0), dtype=np.float32)
_EMPTY_IDS = np.zeros((0, 0), dtype=np.int64)


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
    def row_major(cls, values: np.ndarray, missing: np.ndarray, floats: np.ndarray | None = None) -> ColumnBlock:
        """The block of a C-contiguous [rows, columns] array (int64 or float64) and its bool missing mask
        [rows, columns]; with ``floats`` (float64 [rows, more columns]), their columns follow (the mask then
        covers both, ``values``' columns first). ``values`` alone is used in place; with ``floats`` both are
        copied into one buffer."""
        rows, columns = values.shape
        more = 0 if floats is None else floats.shape[1]
        if not more:  # (a layout made once per type and column count, shared: ~13 us a chunk to build)
            return cls(values.reshape(-1).view(np.uint8), missing.reshape(-1).view(np.uint8),
                       _row_major_layout(CODES[values.dtype], columns), rows)
        width = columns + more
        layout = [(CODES[values.dtype], c, columns, BYTE_FLAGS, c, width) for c in range(columns)]
        data = np.empty(rows * width * 8, dtype=np.uint8)
        split = rows * columns * values.itemsize
        data[:split] = values.reshape(-1).view(np.uint8)
        data[split:] = np.ascontiguousarray(floats, dtype=np.float64).reshape(-1).view(np.uint8)
        layout += [(CODES[np.dtype(np.float64)], rows * columns + c, more, BYTE_FLAGS, columns + c, width)
                   for c in range(more)]
        return cls(data, missing.reshape(-1).view(np.uint8), np.array(layout, dtype=np.int64).reshape(width, 6), rows)

    @classmethod
    def records(cls, data: np.ndarray, dtypes, offsets, record: int, flags_at: int, flag_bits, flag_bytes: int,
                rows: int) -> ColumnBlock:
        """The block of a buffer of ``rows`` fixed-size records of ``record`` bytes (a multiple of 8) from byte
        0: column ``c`` of type ``dtypes[c]`` at byte ``offsets[c]`` of each record (which its item size
        divides); each row's missing flags ``flag_bytes`` bytes from byte ``flags_at`` (a multiple of 8),
        column ``c``'s in bit ``flag_bits[c]`` (bit ``b % 8`` of byte ``b // 8``), as converted tables store a
        chunk."""
        layout = [(CODES[np.dtype(d)], o // np.dtype(d).itemsize, record // np.dtype(d).itemsize, BIT_FLAGS,
                   8 * flags_at + int(b), 8 * flag_bytes) for d, o, b in zip(dtypes, offsets, flag_bits)]
        return cls(data, data, np.array(layout, dtype=np.int64).reshape(len(layout), 6), rows)


@functools.lru_cache(maxsize=None)
def _row_major_layout(code: int, columns: int) -> np.ndarray:
    """``ColumnBlock.row_major``'s layout of ``columns`` columns of type ``code`` and no floats (never written)."""
    return np.array([(code, c, columns, BYTE_FLAGS, c, columns) for c in range(columns)], np.int64).reshape(columns, 6)


def gather_picks(label: int | None, dense, ids) -> np.ndarray:
    """The ``picks`` of :func:`gather_columns` that send block column ``label`` to the label, ``dense[k]`` to
    dense row ``k`` and ``ids[k]`` to id row ``k``."""
    picks = [(label, LABEL, 0)] if label is not None else []
    picks += [(c, DENSE, k) for k, c in enumerate(dense)] + [(c, IDS, k) for k, c in enumerate(ids)]
    return np.array(picks, dtype=np.int64).reshape(-1, 3)


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


def gather_blocks(blocks, picks: np.ndarray, bounds: np.ndarray, local: np.ndarray, positions: np.ndarray, *,
                  missing_id: int, label: np.ndarray | None = None, dense: np.ndarray | None = None,
                  ids: np.ndarray | None = None) -> bool:
    """:func:`gather_columns` for the rows of many blocks in one native call: group ``g``'s rows (entries
    ``bounds[g]:bounds[g + 1]`` of ``local`` and ``positions``, as :func:`group_by_chunk` gives them) from
    ``blocks[g]``. The batch is written in its positions' order, each output row front to back once. Only
    blocks of row records with bit flags laid out alike (a converted table's chunks) are taken, and only by the
    numba kernel: otherwise it returns False having written nothing, and the caller gathers block by block.

    The kernel reads the blocks by address: the caller holds every block (their buffers) until it returns."""
    native = kernels("gather")
    if native is None or not blocks:
        return not blocks
    try:  # (np.array of a list: no Python-level steps, where np.stack takes about ten)
        layouts = np.array([b.layout for b in blocks], dtype=np.int64)
    except ValueError:  # layouts of different numbers of columns
        return False
    if layouts.ndim != 3:
        return False
    addresses = np.empty((len(blocks), 2), dtype=np.int64)
    address_of = native.address_of  # (0.7 us a call, where ``ndarray.ctypes.data`` took 3.3, holding the GIL)
    for g, b in enumerate(blocks):
        addresses[g, 0] = address = address_of(b.data)
        addresses[g, 1] = address if b.flags is b.data else address_of(b.flags)
    return bool(native.gather_blocks(addresses, layouts, picks, bounds, local, positions, np.int64(missing_id),
                                     np.zeros(0, np.float32) if label is None else label,
                                     _EMPTY_ROWS if dense is None else dense,
                                     _EMPTY_IDS if ids is None else ids))


def block_addresses(block: ColumnBlock) -> tuple[int, int] | None:
    """(data, flags) byte addresses of a block that :func:`gather_table` can read by address (row records with
    bit flags are checked there), or None where no native kernel is there to read it."""
    native = kernels("gather")
    if native is None:
        return None
    address = native.address_of(block.data)
    return address, address if block.flags is block.data else native.address_of(block.flags)


def gather_table(rows: np.ndarray, first_row: np.ndarray, num_rows: int, addresses: np.ndarray,
                 layouts: np.ndarray, picks: np.ndarray, touched: np.ndarray, *, missing_id: int,
                 label: np.ndarray | None = None, dense: np.ndarray | None = None, ids: np.ndarray | None = None
                 ) -> int:
    """:func:`gather_blocks` for ``rows`` (1-D int64, global numbers, any order) of a table whose chunks
    (``first_row`` as :func:`group_by_chunk` takes it) are found by number, in one native call that also groups
    them: chunk ``c`` at byte addresses ``addresses[c]`` (int64 [chunks, 2], data and flags, as
    :func:`block_addresses` gives them; 0: not at hand) laid out as ``layouts[c]`` (int64 [chunks, columns, 6]).
    Writes the same bits as ``gather_blocks`` over the chunks' blocks in the order ``group_by_chunk`` gives.
    Returns the number of chunks read (their numbers in ``touched``, int64 [>= chunks], in order of first
    appearance); or, having written nothing (the caller then gathers another way): -1 where one is not at hand
    (or no native kernel is there), -2 where a row is not in ``[0, num_rows)``, -3 where the chunks are not
    laid out as ``gather_blocks`` takes.

    The kernel reads the chunks by address: the caller holds every chunk given an address until it returns."""
    native = kernels("gather")
    if native is None:
        return -1
    return int(native.gather_table(rows, first_row, np.int64(num_rows), addresses, layouts, picks,
                                   np.int64(missing_id), np.zeros(0, np.float32) if label is None else label,
                                   _EMPTY_ROWS if dense is None else dense, _EMPTY_IDS if ids is None else ids,
                                   touched))


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


def group_by_chunk(rows: np.ndarray, first_row: np.ndarray, num_rows: int, *, max_groups: int = 64
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` (1-D int64, any order, each in ``[0, num_rows)``: an ``IndexError`` says otherwise) grouped by
    chunk (``first_row``: the chunks' first rows, increasing, the first 0): ``(chunks, bounds, local,
    positions)``: group ``g`` is chunk ``chunks[g]``, holding entries ``bounds[g]:bounds[g + 1]`` of ``local``
    (the row within its chunk) and ``positions`` (where the row is in ``rows``). Groups come in order of first
    appearance and keep the rows' order within them."""
    n = rows.shape[0]
    native = kernels("gather")
    if native is not None:
        chunks = np.empty(max_groups, dtype=np.int64)
        bounds = np.empty(max_groups + 1, dtype=np.int64)
        local = np.empty(n, dtype=np.int64)
        positions = np.empty(n, dtype=np.int64)
        groups = native.group_by_chunk(rows, first_row, num_rows, chunks, bounds, local, positions)
        if groups >= 0:
            return chunks[:groups], bounds[:groups + 1], local, positions
    if n and (rows.min() < 0 or rows.max() >= num_rows):
        raise IndexError(f"rows must lie in [0, {num_rows}), got values in [{rows.min()}, {rows.max()}]")
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


def touched_chunks(rows: np.ndarray, first_row: np.ndarray, num_rows: int) -> np.ndarray:
    """The chunks (numbers, increasing) holding any of ``rows`` (1-D int64, each in ``[0, num_rows)``: an
    ``IndexError`` says otherwise; ``first_row`` as :func:`group_by_chunk` takes it)."""
    native = kernels("gather")
    if native is not None and first_row.size:
        out = np.empty(first_row.size, dtype=np.int64)
        count = native.touched_chunks(rows, first_row, num_rows, out)
        if count >= 0:
            return out[:count]
    if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
        raise IndexError(f"rows must lie in [0, {num_rows}), got values in [{rows.min()}, {rows.max()}]")
    return np.unique(np.searchsorted(first_row, rows, side="right") - 1)
