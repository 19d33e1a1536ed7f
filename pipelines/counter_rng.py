"""Counter-based random numbers: a value is a pure function of (seed, epoch, sample index, draw number).

Augmentation randomness keyed this way does not depend on batch size, sharding, placement or on where a
run was resumed, so the same sample gets the same crop and flip on a CPU, on a GPU and after a restart.
"""
from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def uniform(seed: int, epoch: int, index: np.ndarray, draws: int) -> np.ndarray:
    """float64 array [len(index), draws] of independent U[0, 1) values."""
    with np.errstate(over="ignore"):
        base = _splitmix64(_splitmix64(np.uint64(seed) ^ (np.uint64(epoch) << np.uint64(32))))
        keys = _splitmix64(base ^ np.asarray(index, dtype=np.uint64))
        counters = keys[:, None] + np.arange(1, draws + 1, dtype=np.uint64)[None, :] * _M2
        bits = _splitmix64(counters) >> np.uint64(11)
    return bits.astype(np.float64) * (1.0 / (1 << 53))
