"""Gathering rows of typed columns (numba): the CPU kernels behind ``gather_columns.py``, whose NumPy code is
their reference. Column ``c`` of a block is described by ``layout[c]`` = (code, start, step, flag kind, flag
start, flag step); see ``gather_columns.ColumnBlock``.

Each column of a piece is loaded in three short passes (values widened to int64 or float64, missing flags,
then the output): the branches on type, flag kind and target stay outside the loops without multiplying
into each other, which keeps the compile time at a few seconds.
"""
from __future__ import annotations

import numpy as np

from ._numba import helper, kernel

# The codes of gather_columns.CODES, spelled again here for numba (tests check they agree).
U8, I8, U16, I16, U32, I32, I64, F32, F64 = range(9)
NO_FLAGS, BYTE_FLAGS, BIT_FLAGS = range(3)
LABEL, DENSE, IDS = range(3)
NAN32 = np.float32(np.nan)


@helper
def copy_values(values, start, step, local, out):
    for i in range(local.shape[0]):
        out[i] = values[np.uint64(start + local[i] * step)]


@helper
def load_ints(data, code, start, step, local, out):
    """``out[i]`` = the int column's value at row ``local[i]``, as int64."""
    if code == U8:
        copy_values(data, start, step, local, out)
    elif code == I8:
        copy_values(data.view(np.int8), start, step, local, out)
    elif code == U16:
        copy_values(data.view(np.uint16), start, step, local, out)
    elif code == I16:
        copy_values(data.view(np.int16), start, step, local, out)
    elif code == U32:
        copy_values(data.view(np.uint32), start, step, local, out)
    elif code == I32:
        copy_values(data.view(np.int32), start, step, local, out)
    else:
        copy_values(data.view(np.int64), start, step, local, out)


@helper
def load_floats(data, code, start, step, local, out):
    if code == F32:
        copy_values(data.view(np.float32), start, step, local, out)
    else:
        copy_values(data.view(np.float64), start, step, local, out)


@helper
def load_missing(flags, kind, first, step, local, out):
    if kind == BYTE_FLAGS:
        for i in range(local.shape[0]):
            out[i] = flags[np.uint64(first + local[i] * step)] != 0
    elif kind == BIT_FLAGS:
        for i in range(local.shape[0]):
            bit = np.uint64(first + local[i] * step)
            out[i] = (flags[bit >> np.uint64(3)] >> (bit & np.uint64(7))) & 1 != 0
    else:
        out[:] = False


@kernel
def gather_columns(data, flags, layout, picks, local, positions, missing_id, label, dense, ids):
    n = local.shape[0]
    ints = np.empty(n, np.int64)
    floats = np.empty(n, np.float64)
    missing = np.empty(n, np.bool_)
    for j in range(picks.shape[0]):
        c, target, row = picks[j, 0], picks[j, 1], picks[j, 2]
        code = layout[c, 0]
        is_float = code >= F32
        if is_float:
            load_floats(data, code, layout[c, 1], layout[c, 2], local, floats)
        else:
            load_ints(data, code, layout[c, 1], layout[c, 2], local, ints)
        if target != LABEL:
            load_missing(flags, layout[c, 3], layout[c, 4], layout[c, 5], local, missing)
        # Each value is loaded before the choice, so that the choice compiles to a select: missing flags are
        # random, and a branch on them would be mispredicted a third of the time.
        if target == IDS:
            out_ids = ids[row]
            for i in range(n):
                v = ints[i]
                out_ids[np.uint64(positions[i])] = missing_id if missing[i] else v
        elif target == DENSE and is_float:
            out_dense = dense[row]
            for i in range(n):
                f = np.float32(floats[i])
                out_dense[np.uint64(positions[i])] = NAN32 if missing[i] else f
        elif target == DENSE:
            out_dense = dense[row]
            for i in range(n):
                f = np.float32(ints[i])
                out_dense[np.uint64(positions[i])] = NAN32 if missing[i] else f
        elif is_float:
            for i in range(n):
                label[np.uint64(positions[i])] = np.float32(floats[i])
        else:
            for i in range(n):
                label[np.uint64(positions[i])] = np.float32(ints[i])


@kernel
def gather_raw(data, flags, layout, int_columns, float_columns, local, ints, floats, missing):
    """Columns as they are: ``ints`` int64 [n, I], ``floats`` float64 [n, F], ``missing`` bool [n, I + F]."""
    n = local.shape[0]
    values = np.empty(n, np.int64)
    reals = np.empty(n, np.float64)
    flags_out = np.empty(n, np.bool_)
    count = int_columns.shape[0]
    for j in range(count + float_columns.shape[0]):
        c = int_columns[j] if j < count else float_columns[j - count]
        if j < count:
            load_ints(data, layout[c, 0], layout[c, 1], layout[c, 2], local, values)
            ints[:, j] = values
        else:
            load_floats(data, layout[c, 0], layout[c, 1], layout[c, 2], local, reals)
            floats[:, j - count] = reals
        load_missing(flags, layout[c, 3], layout[c, 4], layout[c, 5], local, flags_out)
        missing[:, j] = flags_out


@helper
def chunk_of(first_row, top, row):
    """The last chunk whose first row is <= ``row``: a binary search without branches (``top``: the largest
    power of two <= the number of chunks), as the rows come in random order."""
    chunks = first_row.shape[0]
    k = 0
    step = top
    while step > 0:
        j = k + step
        ok = (j < chunks) & (first_row[min(j, chunks - 1)] <= row)
        k = j if ok else k
        step >>= 1
    return k


@kernel
def group_by_chunk(rows, first_row, num_rows, chunks, bounds, local, positions):
    """Rows grouped by the chunk holding them (``first_row``: each chunk's first row, increasing), in order of
    first appearance, each group keeping the rows' order: ``chunks[g]`` is group g's chunk, its rows
    ``bounds[g]:bounds[g + 1]`` of ``local`` (row within the chunk) and ``positions`` (index into ``rows``).
    Returns the number of groups, -1 when more than ``chunks.shape[0]`` chunks are met, -2 when a row is not
    in ``[0, num_rows)``."""
    n = rows.shape[0]
    for i in range(n):
        if rows[i] < 0 or rows[i] >= num_rows:
            return -2
    slot = np.empty(n, np.int64)
    counts = np.zeros(chunks.shape[0] + 1, np.int64)
    groups = 0
    last = -1
    last_slot = 0
    top = 1
    while top * 2 <= first_row.shape[0]:
        top *= 2
    for i in range(n):
        c = chunk_of(first_row, top, rows[i])
        if c != last:
            s = 0
            while s < groups and chunks[s] != c:
                s += 1
            if s == groups:
                if groups == chunks.shape[0]:
                    return -1
                chunks[s] = c
                groups += 1
            last, last_slot = c, s
        slot[i] = last_slot
        counts[last_slot + 1] += 1
    for g in range(groups):
        counts[g + 1] += counts[g]
    for g in range(groups + 1):
        bounds[g] = counts[g]
    for i in range(n):
        s = slot[i]
        k = counts[s]
        counts[s] = k + 1
        local[k] = rows[i] - first_row[chunks[s]]
        positions[k] = i
    return groups
