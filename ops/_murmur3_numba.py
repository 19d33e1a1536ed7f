"""MurmurHash3_x86_32 kernels for the CPU (numba): the twins of ``murmur3.cuh`` and of the NumPy code in
``_murmur3_words.py``, which stays their reference.

``bucket`` reduces a hash modulo ``n`` without an integer division (a 64-bit ``div`` costs tens of cycles and
keeps the loops from being vectorised), by Lemire's direct remainder ("Faster Remainder by Direct Computation",
Lemire, Kaser and Kurz 2019, fastmod_u32): with ``magic = (2**64 - 1) // n + 1`` (wrapping to 0 for n = 1),
``h % n = ((magic * h mod 2**64) * n) >> 64``, exact for every 32-bit ``h`` and ``1 <= n < 2**32``. The
128-bit product's high word is made from two 32 x 32 -> 64-bit products, which vectorise.

The kernels hash a tile of keys at a time in two loops: the hashes alone (32-bit words in, 32-bit
hashes out: eight to a vector), then the buckets (64-bit): one loop over both runs four to a vector.
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
def fastmod_magic(n):
    """The multiplier ``bucket`` takes for ``n`` (1 <= n < 2**32)."""
    return np.uint64(np.uint64(0xFFFFFFFFFFFFFFFF) // np.uint64(n) + np.uint64(1))


@helper
def bucket(h, n, magic):
    """``h % n`` for ``h < 2**32``, ``1 <= n < 2**32`` (n an uint64) and ``magic = fastmod_magic(n)``."""
    h = np.uint64(h)  # magic * h mod 2**64 from 32 x 32-bit products (h < 2**32)
    low = np.uint64((magic & LOW_WORD) * h + (((magic >> np.uint64(32)) * h) << np.uint64(32)))
    top = np.uint64((low >> np.uint64(32)) * n)
    return np.int64((top + (((low & LOW_WORD) * n) >> np.uint64(32))) >> np.uint64(32))


TILE = 2048  # keys hashed before they are reduced: the tile's hashes stay in L1


@kernel
def hash_columns(words, rows, num_buckets, seeds, targets, out):
    """``out[targets[k], i] = murmur3(raw[rows[k], i], seeds[k]) % num_buckets[k]`` with ``words`` the int64
    [_, B] batch ``raw`` viewed as uint32 [_, 2B] (little-endian: a key's low word first); out int64 [_, B]."""
    batch = words.shape[1] // 2
    hashes = np.empty(min(TILE, batch), dtype=np.uint32)
    for k in range(rows.shape[0]):
        source = words[rows[k]]
        target = out[targets[k]]
        n = np.uint64(num_buckets[k])
        magic = fastmod_magic(n)
        seed = np.uint32(seeds[k])
        for start in range(0, batch, TILE):
            m = min(TILE, batch - start)
            keys = source[2 * start:2 * (start + m)]
            for i in range(m):
                hashes[i] = finish(step(step(seed, keys[2 * i]), keys[2 * i + 1]), 8)
            tile = target[start:start + m]
            for i in range(m):
                tile[i] = bucket(hashes[i], n, magic)


@kernel
def cross_columns(words, a_rows, b_rows, num_buckets, seeds, targets, out):
    """``out[targets[k], i] = murmur3(le8(raw[a_rows[k], i]) || le8(raw[b_rows[k], i]), seeds[k])
    % num_buckets[k]``, ``words`` being raw viewed as uint32 (as for ``hash_columns``)."""
    batch = words.shape[1] // 2
    hashes = np.empty(min(TILE, batch), dtype=np.uint32)
    for k in range(a_rows.shape[0]):
        a = words[a_rows[k]]
        b = words[b_rows[k]]
        target = out[targets[k]]
        n = np.uint64(num_buckets[k])
        magic = fastmod_magic(n)
        seed = np.uint32(seeds[k])
        for start in range(0, batch, TILE):
            m = min(TILE, batch - start)
            ka = a[2 * start:2 * (start + m)]
            kb = b[2 * start:2 * (start + m)]
            for i in range(m):
                h = step(step(seed, ka[2 * i]), ka[2 * i + 1])
                hashes[i] = finish(step(step(h, kb[2 * i]), kb[2 * i + 1]), 16)
            tile = target[start:start + m]
            for i in range(m):
                tile[i] = bucket(hashes[i], n, magic)


@kernel
def hash_keys(words, width, seed, num_buckets, out):
    """Key i, its ``width`` (2: 8 bytes, 1: 4 bytes) little-endian uint32 words ``words[width * i:width * (i + 1)]``,
    hashed with ``seed``: the bucket (``num_buckets`` >= 1, ``out`` int64) or, with ``num_buckets`` 0, the hash
    itself (``out`` uint32)."""
    count = out.shape[0]
    seed32 = np.uint32(seed)
    n = np.uint64(num_buckets)
    magic = fastmod_magic(max(n, np.uint64(1)))
    hashes = np.empty(min(TILE, count), dtype=np.uint32)
    for start in range(0, count, TILE):
        m = min(TILE, count - start)
        if width == 2:
            keys = words[2 * start:2 * (start + m)]
            for i in range(m):
                hashes[i] = finish(step(step(seed32, keys[2 * i]), keys[2 * i + 1]), 8)
        else:
            keys = words[start:start + m]
            for i in range(m):
                hashes[i] = finish(step(seed32, keys[i]), 4)
        tile = out[start:start + m]
        if n > 0:
            for i in range(m):
                tile[i] = bucket(hashes[i], n, magic)
        else:
            for i in range(m):
                tile[i] = hashes[i]


@kernel
def bucket_of(hashes, n, out):
    """``out = hashes % n`` through ``bucket`` (uint32 hashes, int64 out): lets tests check the reduction."""
    d = np.uint64(n)
    magic = fastmod_magic(d)
    for i in range(hashes.shape[0]):
        out[i] = bucket(hashes[i], d, magic)
