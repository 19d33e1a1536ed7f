"""MurmurHash3_x86_32 kernels for the CPU (numba): the twins of ``murmur3.cuh`` and of the NumPy code in
``_murmur3_words.py``, which stays their reference.

``bucket`` reduces a hash modulo ``n`` without an integer division, which would keep the loops from being
vectorised: with ``inverse = 1.0 / n`` (float64), ``q = int(h * inverse)`` is the true quotient or off by one
either way (``h < 2**32`` and the product's relative error is below ``2**-52``, so its absolute error is below
``2**-20``), and one correction step on the remainder makes it exact.
"""
from __future__ import annotations

import numpy as np

from ._numba import helper, kernel

C1 = np.uint32(0xCC9E2D51)
C2 = np.uint32(0x1B873593)
M5 = np.uint32(5)
N1 = np.uint32(0xE6546B64)
F1 = np.uint32(0x85EBCA6B)
F2 = np.uint32(0xC2B2AE35)
LOW_WORD = np.uint64(0xFFFFFFFF)


@helper
def rotl(x, r):
    return np.uint32((x << np.uint32(r)) | (x >> np.uint32(32 - r)))


@helper
def step(h, block):
    """One 4-byte block into the running hash (``fl_murmur3_step``)."""
    k = np.uint32(block * C1)
    k = np.uint32(rotl(k, 15) * C2)
    h = rotl(np.uint32(h ^ k), 13)
    return np.uint32(np.uint32(h * M5) + N1)


@helper
def finish(h, length):
    h = np.uint32(h ^ np.uint32(length))
    h = np.uint32(np.uint32(h ^ (h >> np.uint32(16))) * F1)
    h = np.uint32(np.uint32(h ^ (h >> np.uint32(13))) * F2)
    return np.uint32(h ^ (h >> np.uint32(16)))


@helper
def hash_u64(value, seed):
    """The hash of a 64-bit value's 8 little-endian bytes."""
    v = np.uint64(value)
    h = step(seed, np.uint32(v & LOW_WORD))
    h = step(h, np.uint32(v >> np.uint64(32)))
    return finish(h, 8)


@helper
def bucket(h, n, inverse):
    """``h % n`` for ``h < 2**32``, ``1 <= n < 2**32`` and ``inverse = 1.0 / n`` (see the module docstring)."""
    wide = np.int64(h)
    r = wide - np.int64(np.float64(wide) * inverse) * n
    r = r + n if r < 0 else r
    return r - n if r >= n else r


@kernel
def hash_columns(raw, rows, num_buckets, seeds, targets, out):
    """``out[targets[k], i] = murmur3(raw[rows[k], i], seeds[k]) % num_buckets[k]``; raw and out int64 [_, B]."""
    for k in range(rows.shape[0]):
        source = raw[rows[k]]
        target = out[targets[k]]
        n = np.int64(num_buckets[k])
        inverse = 1.0 / np.float64(n)
        seed = np.uint32(seeds[k])
        for i in range(source.shape[0]):
            target[i] = bucket(hash_u64(source[i], seed), n, inverse)


@kernel
def cross_columns(raw, a_rows, b_rows, num_buckets, seeds, targets, out):
    """``out[targets[k], i] = murmur3(le8(raw[a_rows[k], i]) || le8(raw[b_rows[k], i]), seeds[k])
    % num_buckets[k]``."""
    for k in range(a_rows.shape[0]):
        a = raw[a_rows[k]]
        b = raw[b_rows[k]]
        target = out[targets[k]]
        n = np.int64(num_buckets[k])
        inverse = 1.0 / np.float64(n)
        seed = np.uint32(seeds[k])
        for i in range(a.shape[0]):
            va = np.uint64(a[i])
            vb = np.uint64(b[i])
            h = step(seed, np.uint32(va & LOW_WORD))
            h = step(h, np.uint32(va >> np.uint64(32)))
            h = step(h, np.uint32(vb & LOW_WORD))
            h = step(h, np.uint32(vb >> np.uint64(32)))
            target[i] = bucket(finish(h, 16), n, inverse)


@kernel
def hash_keys(keys, seed, num_buckets, out):
    """Each key (uint64: its 8 little-endian bytes; uint32: its 4) hashed with ``seed``: the bucket
    (``num_buckets`` >= 1, ``out`` int64) or, with ``num_buckets`` 0, the hash itself (``out`` uint32)."""
    seed = np.uint32(seed)
    n = np.int64(num_buckets)
    inverse = 1.0 / np.float64(max(n, 1))
    wide = keys.itemsize == 8
    if n > 0:
        for i in range(keys.shape[0]):
            h = hash_u64(keys[i], seed) if wide else finish(step(seed, np.uint32(keys[i])), 4)
            out[i] = bucket(h, n, inverse)
    else:
        for i in range(keys.shape[0]):
            out[i] = hash_u64(keys[i], seed) if wide else finish(step(seed, np.uint32(keys[i])), 4)


@kernel
def bucket_of(hashes, n, out):
    """``out = hashes % n`` through ``bucket`` (uint32 hashes, int64 out): lets tests check the reduction."""
    inverse = 1.0 / np.float64(n)
    for i in range(hashes.shape[0]):
        out[i] = bucket(hashes[i], np.int64(n), inverse)
