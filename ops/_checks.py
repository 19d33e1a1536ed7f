"""Argument checks shared by the ops: each error names the argument, what was expected and what came."""

from __future__ import annotations

import operator
from types import ModuleType

import numpy as np

MAX_UINT32 = 2**32 - 1
MAX_NUM_BUCKETS = MAX_UINT32  # bucket ids are then below it: one uint32 word each
MAX_SEED = MAX_UINT32
KEY_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32), np.dtype(np.int64), np.dtype(np.uint64))


def _as_int(name: str, value: object) -> int:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def check_num_buckets(num_buckets: object) -> int:
    n = _as_int("num_buckets", num_buckets)
    if not 1 <= n <= MAX_NUM_BUCKETS:
        raise ValueError(f"num_buckets must be in [1, {MAX_NUM_BUCKETS}], got {n}")
    return n


def check_seed(seed: object) -> int:
    s = _as_int("seed", seed)
    if not 0 <= s <= MAX_SEED:
        raise ValueError(f"seed must be in [0, {MAX_SEED}] (a uint32), got {s}")
    return s


def check_optional_positive_int(name: str, value: object) -> int | None:
    if value is None:
        return None
    n = _as_int(name, value)
    if n < 1:
        raise ValueError(f"{name} must be a positive int or None, got {n}")
    return n


def integer_keys(name: str, values, xp: ModuleType):
    """``values`` as a C-contiguous, native-endian int32/uint32/int64/uint64 array."""
    if isinstance(values, (list, tuple)) and len(values) == 0:
        values = np.zeros(0, dtype=np.int64)
    array = xp.asarray(values)
    if array.dtype.kind not in "iu" or array.dtype.itemsize not in (4, 8):
        raise TypeError(
            f"{name} must have dtype int32, uint32, int64 or uint64, got dtype {array.dtype}"
        )
    return xp.asarray(array, dtype=array.dtype.newbyteorder("="), order="C")


def offsets_array(name: str, offsets, limit: int, limit_name: str, xp: ModuleType):
    """Validated Arrow-style offsets as int64: 1-D, at least one entry, non-decreasing, in [0, limit]."""
    array = xp.asarray(offsets)
    if array.dtype.kind not in "iu" or array.dtype == np.uint64:
        raise TypeError(f"{name} must be an int32 or int64 array, got dtype {array.dtype}")
    if array.ndim != 1 or array.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with at least one entry, got shape {array.shape}")
    array = xp.ascontiguousarray(array, dtype=np.int64)
    first, last = int(array[0]), int(array[-1])
    if first < 0 or last > limit:
        raise ValueError(
            f"{name} must lie in [0, {limit}] (the length of {limit_name}), "
            f"got first {first} and last {last}"
        )
    if array.shape[0] > 1 and bool((array[1:] < array[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing")
    return array
