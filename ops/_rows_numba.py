"""Row blocks on the CPU (numba): the kernels behind ``row_blocks.py``, whose NumPy code is their reference.

``gather_rows`` reads each chunk's block through its address (``RowBlocks.addresses``), so one call serves
rows of any number of blocks without a Python step per block.
"""
from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from ._numba import helper, kernel

TILE = 256  # rows of ids packed at a time, column after column


def _pointer(kind):
    """An intrinsic giving the ``kind`` values from byte ``address`` on."""
    @intrinsic
    def at(typingctx, address):
        signature = types.CPointer(kind)(types.int64)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(sig.return_type))
        return signature, codegen
    return at


_words_at, _floats_at = _pointer(types.uint32), _pointer(types.float32)


@kernel
def pack_rows(block, floats, start, has_label, label, dense, ids, more):
    """Rows ``start..`` of ``block`` (uint32 [rows, W]; ``floats``: the same memory as float32). Returns the
    first column of ``ids`` then ``more`` (counted on) holding a value outside [0, 2**32), or -1."""
    n = max(label.shape[0], dense.shape[0], ids.shape[1], more.shape[1])
    d = dense.shape[1]
    k = ids.shape[0]
    first_id = has_label + d
    bad = -1
    for i in range(n):
        r = start + i
        if has_label:
            floats[r, 0] = label[i]
        for j in range(d):
            floats[r, has_label + j] = dense[i, j]
    for first in range(0, n, TILE):  # ids: a tile of rows at a time (its rows of the block stay in cache)
        last = min(n, first + TILE)
        for j in range(k + more.shape[0]):
            source = ids[j] if j < k else more[j - k]
            wide = np.int64(0)
            for i in range(first, last):
                v = source[i]
                wide |= v
                block[start + i, first_id + j] = np.uint32(v)
            if (wide >> 32) != 0 and bad < 0:
                bad = j
    return bad


@helper
def chunk_of(first_row, top, row):
    """The last chunk whose first row is <= ``row``, by a binary search without branches (``top``: the largest
    power of two <= the number of chunks)."""
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
def locate_rows(rows, first_row, num_rows, chunk, local, touched, counts):
    n = rows.shape[0]
    for i in range(n):
        if rows[i] < 0 or rows[i] >= num_rows:
            return -2
    top = 1
    while top * 2 <= first_row.shape[0]:
        top *= 2
    found = 0
    last = -1
    last_slot = 0
    for i in range(n):
        c = chunk_of(first_row, top, rows[i])
        chunk[i] = c
        local[i] = rows[i] - first_row[c]
        if c != last:
            s = 0
            while s < found and touched[s] != c:
                s += 1
            if s == found:
                if found == touched.shape[0]:
                    return -1
                touched[s] = c
                counts[s] = 0
                found += 1
            last, last_slot = c, s
        counts[last_slot] += 1
    return found


@kernel
def gather_rows(addresses, chunk_rows, width, has_label, chunk, local, label, dense, ids, more):
    """Returns -1, or a chunk that has no block (or a row past its end): nothing is read from it."""
    n = chunk.shape[0]
    for i in range(n):
        c = chunk[i]
        if addresses[c] == 0 or local[i] < 0 or local[i] >= chunk_rows[c]:
            return c
    d = dense.shape[1]
    k = ids.shape[0]
    k2 = more.shape[0]
    first_id = has_label + d
    for i in range(n):
        at = addresses[chunk[i]] + local[i] * width * 4
        values = _floats_at(at)
        words = _words_at(at)
        if has_label:
            label[i] = values[0]
        for j in range(d):
            dense[i, j] = values[has_label + j]
        for j in range(k):
            ids[j, i] = words[first_id + j]
        for j in range(k2):
            more[j, i] = words[first_id + k + j]
    return -1


@kernel
def least_recently_read(kept, pins, read, stamps, since, chunk_rows, excess, out):
    """The chunks to drop until ``excess`` rows are gone into ``out``, in order; returns how many."""
    n = 0
    gone = 0
    while gone < excess and n < out.shape[0]:
        best = -1
        for c in range(kept.shape[0]):
            if not kept[c] or pins[c] != 0:
                continue
            taken = False
            for k in range(n):
                taken |= out[k] == c
            if taken:
                continue
            if best < 0:
                best = c
            elif read[c] != read[best]:
                if read[c]:  # (read ones go first)
                    best = c
            elif stamps[c] < stamps[best] or (stamps[c] == stamps[best] and since[c] < since[best]):
                best = c
        if best < 0:
            break
        out[n] = best
        n += 1
        gone += chunk_rows[best]
    return n


@kernel
def pin_chunks(touched, found, pins, kept, missing):
    """Pins ``touched[:found]``; those not ``kept`` into ``missing``, in order; returns how many."""
    n = 0
    for i in range(found):
        c = touched[i]
        pins[c] += 1
        if not kept[c]:
            missing[n] = c
            n += 1
    return n


@kernel
def unpin_read_chunks(touched, found, pins, stamps, clock, read, bad, with_bad):
    """``touched[:found]`` read at ``clock`` and unpinned; those with ``bad`` rows into ``with_bad``; how many."""
    n = 0
    for i in range(found):
        c = touched[i]
        stamps[c] = clock
        read[c] = True
        pins[c] -= 1
        if bad[c]:
            with_bad[n] = c
            n += 1
    return n
