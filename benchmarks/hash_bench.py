"""CPU throughput of ``feedline.ops.hash_buckets`` on int64 keys, against memcpy in the same run.

The hash runs on one thread: the numba kernel that ``hash_buckets`` uses where numba is installed
(``keys_per_s``), and the NumPy implementation it falls back to (``numpy_keys_per_s``, also the tests'
reference); ``criteo_batch_ms`` is ``hash_columns`` over a Criteo batch (26 columns of 8192 ids). Pass
``pin_cpu`` to also pin the process to one CPU while it measures (``os.sched_setaffinity``, restored
afterwards). Hashing reads 8 bytes and writes 8 bytes per key, the same volume as ``np.copyto`` of the key
array, so ``fraction_of_copy_bandwidth`` is copy time / hash time for that array.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator

import numpy as np

from feedline.ops import hash_buckets, hash_columns, hash_plan
from feedline.ops._murmur3_words import hash_words, key_words


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def bench_hash(
    num_keys: int = 10_000_000,
    repeats: int = 5,
    num_buckets: int = 1_000_003,
    seed: int = 0,
    pin_cpu: int | None = None,
) -> dict:
    rng = np.random.default_rng(0)
    keys = rng.integers(-(2**63), 2**63 - 1, num_keys, dtype=np.int64)
    copy_target = np.empty_like(keys)
    reference = np.empty(num_keys, dtype=np.int64)
    batch = rng.integers(-1, 2**32, (26, 8192), dtype=np.int64)
    columns = hash_plan(np.arange(26), [num_buckets] * 26, np.arange(26))
    with pinned(pin_cpu):
        hash_buckets(keys[:1000], num_buckets, seed)
        hash_columns(batch, columns)
        hash_s = best_seconds(lambda: hash_buckets(keys, num_buckets, seed), repeats)
        numpy_s = best_seconds(lambda: hash_words([key_words(keys)], seed, num_buckets, reference), repeats)
        batch_s = best_seconds(lambda: hash_columns(batch, columns), 10 * repeats)
        copy_s = best_seconds(lambda: np.copyto(copy_target, keys), repeats)
    keys_per_s = num_keys / hash_s
    copy_bytes_per_s = keys.nbytes / copy_s
    return {
        "op": "hash",
        "keys_per_s": keys_per_s,
        "numpy_keys_per_s": num_keys / numpy_s,
        "criteo_batch_ms": batch_s * 1e3,
        "copy_bytes_per_s": copy_bytes_per_s,
        "fraction_of_copy_bandwidth": keys_per_s * keys.itemsize / copy_bytes_per_s,
        "num_keys": num_keys,
        "num_buckets": num_buckets,
        "repeats": repeats,
        "pinned_cpu": pin_cpu,
    }


if __name__ == "__main__":
    print(json.dumps(bench_hash(), indent=2))
