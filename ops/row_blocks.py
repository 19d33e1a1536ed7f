"""Rows kept in their finished form, and a batch gathered out of them in one pass.

A *row block* holds a run of rows of a table as a batch delivers them, row-major, one 32-bit word per value
(``RowLayout``): the label (float32 bits, if any), the ``dense`` values (float32 bits), then the ``ids`` and
``more`` ids (uint32: bucket ids, which are below 2**32). A shuffled batch takes scattered rows: each costs
the few cache lines of its own words, where gathering raw columns costs a pass per column over every row.

``pack_rows`` writes a run of rows into a block from arrays laid out as a batch's (``label`` float32 [n],
``dense`` float32 [n, D], ``ids`` int64 [K, n], ``more`` int64 [K2, n]); ``gather_rows`` writes chosen rows
of many blocks back into such arrays, exactly: a value packed and gathered is the value given. ``RowBlocks``
is the table of blocks a gather reads (by chunk number), and ``locate_rows`` finds each row's chunk.

Each runs as a GIL-free numba kernel where numba is installed, else in NumPy (the reference the kernels are
tested against).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ._checks import MAX_UINT32
from ._native import kernels

_NO_FLOATS = np.zeros(0, dtype=np.float32)
_NO_ROWS = np.zeros((0, 0), dtype=np.float32)
_NO_IDS = np.zeros((0, 0), dtype=np.int64)
MAX_ID = MAX_UINT32
_F32, _I64, _U32 = np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.uint32)


@dataclass(frozen=True)
class RowLayout:
    """Words per row: ``label`` (0 or 1), then ``dense``, ``ids`` and ``more`` of them."""

    label: int
    dense: int
    ids: int
    more: int

    def __post_init__(self) -> None:
        if self.label not in (0, 1):
            raise ValueError(f"label must be 0 or 1 words, got {self.label!r}")
        for name in ("dense", "ids", "more"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a number of words >= 0, got {value!r}")

    @functools.cached_property
    def width(self) -> int:
        """Words a row (at least 1): worked out once (a chunk's preparation asks for it a few times a run)."""
        return max(self.label + self.dense + self.ids + self.more, 1)

    def empty(self, rows: int) -> np.ndarray:
        return np.empty((rows, self.width), dtype=np.uint32)


def _or_empty(label, dense, ids, more):
    return (_NO_FLOATS if label is None else label, _NO_ROWS if dense is None else dense,
            _NO_IDS if ids is None else ids, _NO_IDS if more is None else more)


def _check(layout: RowLayout, n: int, label, dense, ids, more) -> None:
    if label.shape == ((n,) if layout.label else (0,)) and dense.shape == ((n, layout.dense) if layout.dense else (0, 0)) \
            and ids.shape == ((layout.ids, n) if layout.ids else (0, 0)) \
            and more.shape == ((layout.more, n) if layout.more else (0, 0)) \
            and label.dtype == _F32 and dense.dtype == _F32 and ids.dtype == _I64 and more.dtype == _I64 \
            and label.flags.c_contiguous and dense.flags.c_contiguous and ids.flags.c_contiguous \
            and more.flags.c_contiguous:
        return  # (all as wanted, seen without building the table below: ~2 us a call, a few a batch)
    wanted = (("label", label, (n,) if layout.label else (0,), np.float32),
              ("dense", dense, (n, layout.dense) if layout.dense else (0, 0), np.float32),
              ("ids", ids, (layout.ids, n) if layout.ids else (0, 0), np.int64),
              ("more", more, (layout.more, n) if layout.more else (0, 0), np.int64))
    for name, array, shape, dtype in wanted:
        if array.dtype != dtype or array.shape != shape or not array.flags.c_contiguous:
            raise ValueError(f"{name} must be a C-contiguous {np.dtype(dtype)} array of shape {shape}, got "
                             f"{array.dtype} {array.shape}")


def pack_rows(block: np.ndarray, start: int, layout: RowLayout, *, label=None, dense=None, ids=None,
              more=None) -> None:
    """Rows ``start .. start + n`` of ``block`` (uint32 [rows, layout.width]) from a run of ``n`` rows: ``label``
    float32 [n], ``dense`` float32 [n, D], ``ids`` and ``more`` int64 [K, n] holding values in [0, 2**32)
    (a ``ValueError`` otherwise). Arrays the layout has no words for are left out (None)."""
    label, dense, ids, more = _or_empty(label, dense, ids, more)
    n = label.shape[0] if layout.label else dense.shape[0] if layout.dense else ids.shape[1] if layout.ids else \
        more.shape[1] if layout.more else 0
    _check(layout, n, label, dense, ids, more)
    if block.dtype != _U32 or block.ndim != 2 or block.shape[1] != layout.width \
            or not block.flags.c_contiguous or not 0 <= start <= block.shape[0] - n:
        raise ValueError(f"block must be a C-contiguous uint32 array of {layout.width} words a row with rows "
                         f"{start}..{start + n}, got {block.dtype} {block.shape}")
    native = kernels("rows")
    if native is not None:
        wrong = native.pack_rows(block, block.view(np.float32), np.int64(start), np.int64(layout.label), label, dense,
                                 ids, more)
        if wrong >= 0:
            name, array = ("ids", ids[wrong]) if wrong < layout.ids else ("more", more[wrong - layout.ids])
            raise ValueError(f"{name} must hold ids in [0, {MAX_ID}], got values in [{int(array.min())}, "
                             f"{int(array.max())}]")
        return
    for name, array in (("ids", ids), ("more", more)):
        if array.size and (int(array.min()) < 0 or int(array.max()) > MAX_ID):
            raise ValueError(f"{name} must hold ids in [0, {MAX_ID}], got values in [{int(array.min())}, "
                             f"{int(array.max())}]")
    rows = block[start:start + n]
    j = 0
    if layout.label:
        rows[:, 0] = label.view(np.uint32)
        j = 1
    for width, words in ((layout.dense, lambda: dense.view(np.uint32)), (layout.ids, lambda: ids.T),
                         (layout.more, lambda: more.T)):
        if width:  # (an array the layout has no words for is an empty stand-in of another shape)
            rows[:, j:j + width] = words()
            j += width


class RowBlocks:
    """The row blocks of a table's chunks, by chunk number: a block set for chunk ``c`` holds its
    ``chunk_rows[c]`` rows. The caller keeps a block from being dropped while a gather reads it."""

    def __init__(self, chunk_rows: np.ndarray, layout: RowLayout):
        self.chunk_rows = np.ascontiguousarray(chunk_rows, dtype=np.int64)
        self.layout = layout
        self.addresses = np.zeros(self.chunk_rows.size, dtype=np.int64)  # 0: no block
        self.blocks: list[np.ndarray | None] = [None] * self.chunk_rows.size

    def set(self, chunk: int, block: np.ndarray, address: int | None = None) -> None:
        """``block`` for chunk ``chunk``. ``address``: its data's address where the caller knows it (reading it
        from ``block.ctypes`` builds Python objects: ~15 us a chunk with the caches cold, as after a parse)."""
        rows = int(self.chunk_rows[chunk])
        if block.dtype != _U32 or block.shape != (rows, self.layout.width) or not block.flags.c_contiguous:
            raise ValueError(f"chunk {chunk}'s block must be C-contiguous uint32 [{rows}, {self.layout.width}], "
                             f"got {block.dtype} {block.shape}")
        self.blocks[chunk] = block
        self.addresses[chunk] = 0 if not block.size else block.ctypes.data if address is None else address

    def drop(self, chunk: int) -> np.ndarray | None:
        block, self.blocks[chunk] = self.blocks[chunk], None
        self.addresses[chunk] = 0
        return block


def least_recently_read(kept: np.ndarray, pins: np.ndarray, read: np.ndarray, stamps: np.ndarray, since: np.ndarray,
                        chunk_rows: np.ndarray, excess: int, out: np.ndarray) -> int:
    """Which held chunks to drop until ``excess`` rows are gone: among the chunks ``c`` with ``kept[c]`` and no
    ``pins[c]``, those ``read`` first, then by ``stamps`` (oldest first), then by ``since`` (the order they were
    taken in), each counted for its ``chunk_rows``; written into ``out`` (int64) in that order. Returns how many
    (fewer where the free chunks run out first)."""
    native = kernels("rows")
    if native is not None:
        return int(native.least_recently_read(kept, pins, read, stamps, since, chunk_rows, np.int64(excess), out))
    free = np.flatnonzero(kept & (pins == 0))
    free = free[np.lexsort((since[free], stamps[free], ~read[free]))]
    n = gone = 0
    for c in free.tolist():
        if gone >= excess or n >= out.shape[0]:
            break
        out[n] = c
        n += 1
        gone += int(chunk_rows[c])
    return n


def pin_chunks(touched: np.ndarray, found: int, pins: np.ndarray, kept: np.ndarray, missing: np.ndarray) -> int:
    """Chunks ``touched[:found]`` (distinct) pinned (``pins`` + 1); those not ``kept`` written into ``missing`` in
    their order. Returns how many are missing."""
    native = kernels("rows")
    if native is not None:
        return int(native.pin_chunks(touched, np.int64(found), pins, kept, missing))
    chunks = touched[:found]
    pins[chunks] += 1
    lacking = chunks[~kept[chunks]]
    missing[:lacking.size] = lacking
    return int(lacking.size)


def unpin_read_chunks(touched: np.ndarray, found: int, pins: np.ndarray, stamps: np.ndarray, clock: int,
                      read: np.ndarray, bad: np.ndarray, with_bad: np.ndarray) -> int:
    """Chunks ``touched[:found]`` (distinct, pinned) read: stamped ``clock``, marked ``read`` and unpinned; those
    with ``bad`` rows written into ``with_bad`` in their order. Returns how many have."""
    native = kernels("rows")
    if native is not None:
        return int(native.unpin_read_chunks(touched, np.int64(found), pins, stamps, np.int64(clock), read, bad,
                                            with_bad))
    chunks = touched[:found]
    stamps[chunks] = clock
    read[chunks] = True
    pins[chunks] -= 1
    bads = chunks[bad[chunks]]
    with_bad[:bads.size] = bads
    return int(bads.size)


def locate_rows(rows: np.ndarray, first_row: np.ndarray, num_rows: int, chunk: np.ndarray, local: np.ndarray,
                touched: np.ndarray, counts: np.ndarray) -> int:
    """For ``rows`` (int64, any order; ``first_row``: each chunk's first row, increasing from 0): each row's
    chunk into ``chunk`` and its row within it into ``local``; the distinct chunks, in order of first
    appearance, into ``touched`` and how many rows each gives into ``counts``. Returns how many distinct chunks
    (-1 when more than ``touched`` holds); an ``IndexError`` for a row outside ``[0, num_rows)``."""
    n = rows.shape[0]
    native = kernels("rows")
    if native is not None:
        found = native.locate_rows(rows, first_row, np.int64(num_rows), chunk, local, touched, counts)
        if found == -2:
            raise IndexError(f"rows must lie in [0, {num_rows}), got values in [{rows.min()}, {rows.max()}]")
        return int(found)
    if n and (rows.min() < 0 or rows.max() >= num_rows):
        raise IndexError(f"rows must lie in [0, {num_rows}), got values in [{rows.min()}, {rows.max()}]")
    chunk[:] = np.searchsorted(first_row, rows, side="right") - 1
    local[:] = rows - first_row[chunk]
    unique, first_seen, number = np.unique(chunk, return_index=True, return_counts=True)
    order = np.argsort(first_seen, kind="stable")
    if unique.size > touched.shape[0]:
        return -1
    touched[:unique.size] = unique[order]
    counts[:unique.size] = number[order]
    return int(unique.size)


def gather_rows(blocks: RowBlocks, chunk: np.ndarray, local: np.ndarray, *, label=None, dense=None, ids=None,
                more=None) -> None:
    """Row ``local[i]`` of chunk ``chunk[i]``'s block into position ``i`` of ``label`` (float32 [n]), ``dense``
    (float32 [n, D]), ``ids`` and ``more`` (int64 [K, n]), as ``blocks.layout`` says. Every chunk read must
    have its block set (a ``LookupError`` names one that has not)."""
    layout = blocks.layout
    n = chunk.shape[0]
    label, dense, ids, more = _or_empty(label, dense, ids, more)
    _check(layout, n, label, dense, ids, more)
    native = kernels("rows")
    if native is not None:
        missing = native.gather_rows(blocks.addresses, blocks.chunk_rows, np.int64(layout.width),
                                     np.int64(layout.label), chunk, local, label, dense, ids, more)
        if missing >= 0:
            raise LookupError(f"chunk {missing} has no row block, or a row asked of it lies outside it")
        return
    for c in np.unique(chunk).tolist():
        block = blocks.blocks[c]
        if block is None:
            raise LookupError(f"chunk {c} has no row block")
        at = np.flatnonzero(chunk == c)
        words = block[local[at]]
        j = 0
        if layout.label:
            label[at] = words[:, 0].view(np.float32)
            j = 1
        if layout.dense:
            dense[at] = words[:, j:j + layout.dense].view(np.float32)
            j += layout.dense
        if layout.ids:
            ids[:, at] = words[:, j:j + layout.ids].T
            j += layout.ids
        if layout.more:
            more[:, at] = words[:, j:j + layout.more].T
