"""``cross``: hash bucket of a pair of integer columns (a feature cross).

Definition: each value is widened to its 64-bit two's complement form (signed types sign-extended,
unsigned zero-extended, so any int32/uint32/int64/uint64 column works), and

    cross(a, b)[i] = MurmurHash3_x86_32(le8(a[i]) || le8(b[i]), seed) % num_buckets

where le8(v) are the 8 little-endian bytes of v and || concatenates (16 bytes in all; the hash is
taken as unsigned, the result is int64). It equals
``sklearn.utils.murmurhash3_32(a.to_bytes(8, "little", signed=True) + b.to_bytes(8, "little",
signed=True), seed, positive=True) % num_buckets`` and depends on the order of ``a`` and ``b``.
"""

from __future__ import annotations

import numpy as np

from ._arrays import array_module
from ._checks import check_num_buckets, check_seed, integer_keys
from ._cuda import launch
from ._murmur3_words import hash_words, key_words


def cross(a, b, num_buckets: int, seed: int = 0):
    """int64 bucket of each pair ``(a[i], b[i])``; ``a`` and ``b`` have the same shape and kind."""
    num_buckets = check_num_buckets(num_buckets)
    seed = check_seed(seed)
    xp = array_module(a=a, b=b)
    a = _as_int64("a", a, xp)
    b = _as_int64("b", b, xp)
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape, got {a.shape} and {b.shape}")
    out = xp.empty(a.shape, dtype=np.int64)
    if xp is np:
        hash_words([key_words(a), key_words(b)], seed, num_buckets, out.reshape(-1))
        return out
    n = a.size
    launch("cross.cu", "fl_cross_bucket", n,
           (a, b, np.int64(n), np.uint32(seed), np.uint32(num_buckets), out))
    return out


def _as_int64(name: str, values, xp):
    keys = integer_keys(name, values, xp)
    if keys.dtype == np.uint64:
        return keys.view(np.int64)
    return keys.astype(np.int64, copy=False)
