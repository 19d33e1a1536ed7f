"""``sequence_rows`` on the CPU (numba): the twin of the NumPy code in ``sequence_rows.py``, its reference.

A shuffled window of positions (a buffer-full: a permutation of a run of consecutive positions) is mapped by
laying out the run's rows in order, piece after piece, and reading them back in the positions' order; other
positions each search for their piece."""
from __future__ import annotations

import numpy as np

from ._numba import helper, kernel


@kernel
def sequence_rows(positions, shift, num_samples, seq_start, row_start, rows, valid):
    n = positions.shape[0]
    if n == 0:
        return
    low, high = low_high(positions)
    if high - low + 1 == n and dense_range(positions, low):
        ordered = np.empty(n, np.int64)
        ordered_valid = np.empty(n, np.bool_)
        fill_run(low + shift, num_samples, seq_start, row_start, ordered, ordered_valid)
        for i in range(n):
            rows[i] = ordered[positions[i] - low]
            valid[i] = ordered_valid[positions[i] - low]
        return
    search_each(positions, shift, num_samples, seq_start, row_start, rows, valid)


@helper
def low_high(positions):
    """The smallest and largest of ``positions`` (not empty), by a loop: the arrays' ``min()``/``max()`` come from
    numba's ``arraymath``, whose import (with ``scipy.linalg``, for numba's BLAS check) a cached kernel otherwise
    pays when a process first loads it."""
    low = positions[0]
    high = positions[0]
    for i in range(1, positions.shape[0]):
        v = positions[i]
        low = min(low, v)
        high = max(high, v)
    return low, high


@helper
def dense_range(positions, low):
    """Whether ``positions`` holds every value of ``[low, low + n)`` once."""
    n = positions.shape[0]
    seen = np.zeros(n, np.bool_)
    for i in range(n):
        k = positions[i] - low
        if seen[k]:
            return False
        seen[k] = True
    return True


@helper
def fill_run(first, num_samples, seq_start, row_start, rows, valid):
    """Rows of the consecutive positions ``first, first + 1, ...``, walking the pieces in order."""
    pieces = seq_start.shape[0]
    top = top_step(pieces)
    k = 0
    for i in range(rows.shape[0]):
        v = first + i
        inside = v < num_samples
        v = v if inside else v % num_samples
        if k + 1 < pieces and seq_start[k + 1] <= v or seq_start[k] > v:
            k = piece_of(seq_start, top, v)
        rows[i] = row_start[k] + (v - seq_start[k])
        valid[i] = inside


@helper
def search_each(positions, shift, num_samples, seq_start, row_start, rows, valid):
    top = top_step(seq_start.shape[0])
    for i in range(positions.shape[0]):
        v = positions[i] + shift
        inside = v < num_samples
        v = v if inside else v % num_samples
        k = piece_of(seq_start, top, v)
        rows[i] = row_start[k] + (v - seq_start[k])
        valid[i] = inside


@helper
def top_step(pieces):
    """The largest power of two <= ``pieces``: the first step of ``piece_of``."""
    top = 1
    while top * 2 <= pieces:
        top *= 2
    return top


@helper
def piece_of(seq_start, top, v):
    """The last ``k`` with ``seq_start[k] <= v``, found without branches (positions come in random order)."""
    pieces = seq_start.shape[0]
    k = 0
    step = top
    while step > 0:
        j = k + step
        ok = (j < pieces) & (seq_start[min(j, pieces - 1)] <= v)
        k = j if ok else k
        step >>= 1
    return k


# ---- seeded_permutation: NumPy's Generator(Philox(key, counter)).permutation(n), bit for bit ----------------------
# Philox4x64-10 (Random123, as numpy/random/src/philox) feeds NumPy's shuffle: positions n - 1 down to 1 each swap
# with ``random_interval(i)``, a draw masked to the bits of ``i`` and redrawn while above it, from the generator's
# next 32-bit half-word (both halves of each 64-bit output, low first) while ``i`` fits in 32 bits.
PHILOX_M0 = np.uint64(0xD2E7470EE14C6C93)
PHILOX_M1 = np.uint64(0xCA5A826395121157)
PHILOX_W0 = np.uint64(0x9E3779B97F4A7C15)
PHILOX_W1 = np.uint64(0xBB67AE8584CAA73B)
LOW32 = np.uint64(0xFFFFFFFF)
U0 = np.uint64(0)
U1 = np.uint64(1)
U32 = np.uint64(32)


@kernel
def seeded_permutation(key, counter, out):
    """``out`` (int64 [n]) = the permutation of ``0..n-1`` that NumPy's ``Generator(Philox(key=k, counter=c))
    .permutation(n)`` gives, ``key`` (uint64 [2]) and ``counter`` (uint64 [4]) being ``k`` and ``c`` as Philox
    holds them (words, least significant first); ``n <= 2**32`` (NumPy draws 64-bit words past that)."""
    n = out.shape[0]
    for i in range(n):
        out[i] = i
    ctr = np.empty(4, np.uint64)
    for w in range(4):
        ctr[w] = counter[w]
    block = np.empty(4, np.uint64)
    at = 4  # (the next of ``block``'s outputs; 4: none left)
    spare = U0  # (the high half of the last 64-bit output, while ``has_spare``)
    has_spare = False
    for i in range(n - 1, 0, -1):
        top = np.uint64(i)
        mask = smear(top)
        while True:
            if has_spare:
                value = spare
                has_spare = False
            else:
                if at == 4:
                    philox_block(ctr, key, block)
                    at = 0
                word = block[at]
                at += 1
                spare = word >> U32
                has_spare = True
                value = word & LOW32
            value &= mask
            if value <= top:
                break
        j = np.int64(value)
        out[i], out[j] = out[j], out[i]


@helper
def smear(x):
    """The smallest all-ones mask covering ``x`` (uint64)."""
    x |= x >> U1
    x |= x >> np.uint64(2)
    x |= x >> np.uint64(4)
    x |= x >> np.uint64(8)
    x |= x >> np.uint64(16)
    x |= x >> U32
    return x


@helper
def mul_hi_lo(a, b):
    """The 128-bit product of two uint64 as (high, low) words, from four 32 x 32 -> 64-bit products."""
    a_lo = a & LOW32
    a_hi = a >> U32
    b_lo = b & LOW32
    b_hi = b >> U32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    hi_hi = a_hi * b_hi
    cross = (lo_lo >> U32) + (hi_lo & LOW32) + lo_hi
    high = hi_hi + (hi_lo >> U32) + (cross >> U32)
    low = (cross << U32) | (lo_lo & LOW32)
    return high, low


@helper
def philox_block(ctr, key, block):
    """The counter moved on by one (carrying through its words) and its 10-round Philox4x64 output in ``block``."""
    ctr[0] += U1
    if ctr[0] == U0:
        ctr[1] += U1
        if ctr[1] == U0:
            ctr[2] += U1
            if ctr[2] == U0:
                ctr[3] += U1
    c0, c1, c2, c3 = ctr[0], ctr[1], ctr[2], ctr[3]
    k0, k1 = key[0], key[1]
    for r in range(10):
        if r > 0:
            k0 += PHILOX_W0
            k1 += PHILOX_W1
        hi0, lo0 = mul_hi_lo(PHILOX_M0, c0)
        hi1, lo1 = mul_hi_lo(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    block[0] = c0
    block[1] = c1
    block[2] = c2
    block[3] = c3


@kernel
def batch_rows(indices, valid, bad, index_out, valid_out):
    """``batch_rows``'s pass: ``index_out = indices``, ``valid_out = valid & ~bad``, the count of valid rows."""
    count = 0
    for i in range(indices.shape[0]):
        index_out[i] = indices[i]
        ok = valid[i] and not bad[i]
        valid_out[i] = ok
        count += ok
    return count
