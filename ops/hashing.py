"""``murmur3_32`` and ``hash_buckets``: MurmurHash3_x86_32 of integer keys or strings.

Definition (identical on CPU and GPU, and equal to ``sklearn.utils.murmurhash3_32(key_bytes, seed,
positive=True)`` and cuDF's murmur3 ``hash_values``):

* key bytes: int64/uint64 -> the value's 8 little-endian (two's complement) bytes; int32/uint32 ->
  4 bytes; strings -> their UTF-8 bytes.
* hash: MurmurHash3_x86_32 of those bytes with the uint32 ``seed``.
* bucket: ``hash % num_buckets`` (hash taken as unsigned), returned as int64.

Golden values: int64 10 -> 4004982076 (seed 0), 4279022973 (seed 42).
"""

from __future__ import annotations

import numpy as np

from ._arrays import array_module
from ._checks import check_num_buckets, check_seed, integer_keys
from ._cuda import launch
from ._murmur3_bytes import hash_strings_cpu
from ._murmur3_words import hash_words, key_words
from ._native import kernels
from .strings import Strings, as_strings


def murmur3_32(values, seed: int = 0):
    """uint32 MurmurHash3_x86_32 of each key (see module docstring); same shape and array kind.

    ``values``: an int32/uint32/int64/uint64 array (NumPy or CuPy), ``Strings``, a pyarrow string
    array or a list of ``str``.
    """
    return _hash(values, check_seed(seed), None)


def hash_buckets(values, num_buckets: int, seed: int = 0):
    """int64 bucket id ``murmur3_32(values, seed) % num_buckets`` of each key; same array kind."""
    num_buckets = check_num_buckets(num_buckets)
    return _hash(values, check_seed(seed), num_buckets)


def _hash(values, seed: int, num_buckets: int | None):
    strings = as_strings(values)
    if strings is not None:
        return hash_strings(strings, seed, num_buckets)
    xp = array_module(values=values)
    keys = integer_keys("values", values, xp)
    out = xp.empty(keys.shape, dtype=np.uint32 if num_buckets is None else np.int64)
    if xp is np:
        native = kernels("murmur3")
        if native is not None and keys.size:
            native.hash_keys(keys.reshape(-1).view(np.uint32), keys.dtype.itemsize // 4, seed, num_buckets or 0,
                             out.reshape(-1))
        else:
            hash_words([key_words(keys)], seed, num_buckets, out.reshape(-1))
        return out
    n = keys.size
    bits = 8 * keys.dtype.itemsize
    if num_buckets is None:
        launch("hash_fixed.cu", f"fl_murmur3_hash_u{bits}", n, (keys, np.int64(n), np.uint32(seed), out))
    else:
        launch(
            "hash_fixed.cu",
            f"fl_murmur3_bucket_u{bits}",
            n,
            (keys, np.int64(n), np.uint32(seed), np.uint32(num_buckets), out),
        )
    return out


def hash_strings(strings: Strings, seed: int, num_buckets: int | None):
    """Hash (``num_buckets`` None) or bucket of each string; arguments already validated."""
    xp = array_module(offsets=strings.offsets, data=strings.data)
    n = len(strings)
    out = xp.empty(n, dtype=np.uint32 if num_buckets is None else np.int64)
    if xp is np:
        return hash_strings_cpu(strings.offsets, strings.data, seed, num_buckets, out)
    offsets = xp.ascontiguousarray(strings.offsets)
    data = xp.ascontiguousarray(strings.data)
    if num_buckets is None:
        launch("hash_strings.cu", "fl_murmur3_hash_strings", n,
               (offsets, data, np.int64(n), np.uint32(seed), out))
    else:
        launch("hash_strings.cu", "fl_murmur3_bucket_strings", n,
               (offsets, data, np.int64(n), np.uint32(seed), np.uint32(num_buckets), out))
    return out
