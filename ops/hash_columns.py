"""``hash_columns``: many id columns of a batch hashed to buckets in one pass, each with its own seed and bucket
count, written to chosen rows of one output (a ``KeyedJaggedTensor``'s values, say).

Definition: the batch is feature-major, ``raw`` int64 [rows, B]. A :class:`HashPlan` lists keys; key ``k``
reads one raw row (a categorical column) or two (a cross) and writes

    out[targets[k]] = hash_buckets(raw[sources[k, 0]], num_buckets[k], seeds[k])                   (one row)
    out[targets[k]] = cross(raw[sources[k, 0]], raw[sources[k, 1]], num_buckets[k], seeds[k])      (two rows)

so it equals those functions bit for bit (``hash_buckets`` and ``cross`` are its reference). On the CPU it
runs as a GIL-free numba kernel (NumPy where numba is missing), on the GPU as one CUDA kernel.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ._arrays import array_module
from ._checks import MAX_NUM_BUCKETS, MAX_SEED
from ._cuda import launch
from ._native import kernels
from ._raw_plan import RawRowsPlan
from .cross import cross
from .hashing import hash_buckets


@dataclass(frozen=True, eq=False)
class HashPlan(RawRowsPlan):
    """Keys to hash (validated by :func:`hash_plan`): ``sources`` int64 [K, width] (width 1 or 2),
    ``num_buckets`` int64 [K], ``seeds`` uint32 [K], ``targets`` int64 [K] (distinct output rows)."""

    sources: np.ndarray
    num_buckets: np.ndarray
    seeds: np.ndarray
    targets: np.ndarray
    _device: dict = field(default_factory=dict, repr=False)

    @property
    def width(self) -> int:
        return self.sources.shape[1]

    @functools.cached_property
    def writes(self) -> int:
        """Output rows the plan needs."""
        return int(self.targets.max()) + 1 if self.targets.size else 0

    @functools.cached_property
    def flat_sources(self) -> np.ndarray:
        """``sources`` as one row (made once: a view made per batch holds the GIL)."""
        return self.sources.reshape(-1)

    def __len__(self) -> int:
        return self.sources.shape[0]

    def on_device(self, cupy) -> tuple:
        """(sources, seeds, num_buckets as uint32, targets) on the current device, copied there once."""
        return self._copied(cupy, lambda: (self.sources, self.seeds, self.num_buckets.astype(np.uint32), self.targets))


def _int_array(name: str, values, low: int, high: int, dtype) -> np.ndarray:
    array = np.asarray(values)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise TypeError(f"{name} must hold integers, got dtype {array.dtype}")
    if array.size and (int(array.min()) < low or int(array.max()) > high):
        raise ValueError(f"{name} must lie in [{low}, {high}], got values in [{int(array.min())}, {int(array.max())}]")
    return np.ascontiguousarray(array, dtype=dtype)


def hash_plan(sources, num_buckets, seeds, targets=None) -> HashPlan:
    """Validate the keys of :func:`hash_columns`: ``sources`` [K] (categoricals) or [K, 2] (crosses) raw rows,
    ``num_buckets`` and ``seeds`` [K], ``targets`` [K] distinct output rows (default ``0..K-1``)."""
    sources = _int_array("sources", sources, 0, np.iinfo(np.int64).max, np.int64)
    if sources.ndim == 1:
        sources = sources.reshape(-1, 1)
    if sources.ndim != 2 or sources.shape[1] not in (1, 2):
        raise ValueError(f"sources must be [K] or [K, 2] raw rows, got shape {sources.shape}")
    k = sources.shape[0]
    num_buckets = _int_array("num_buckets", num_buckets, 1, MAX_NUM_BUCKETS, np.int64)
    seeds = _int_array("seeds", seeds, 0, MAX_SEED, np.uint32)
    targets = np.arange(k, dtype=np.int64) if targets is None else \
        _int_array("targets", targets, 0, np.iinfo(np.int64).max, np.int64)
    for name, array in (("num_buckets", num_buckets), ("seeds", seeds), ("targets", targets)):
        if array.shape != (k,):
            raise ValueError(f"{name} must have one entry per key ({k}), got shape {array.shape}")
    if len(set(targets.tolist())) != k:  # (np.unique imports numpy.ma: ~9 ms of a process's first batch)
        raise ValueError(f"targets must be distinct output rows, got {targets.tolist()}")
    return HashPlan(sources, num_buckets, seeds, targets)


def hash_columns(raw, plan: HashPlan, out=None):
    """Every key of ``plan`` hashed from ``raw`` (int64 [rows, B], NumPy or CuPy) into its row of ``out``
    (int64 [>= max(targets) + 1, B], allocated when None; rows no key targets are left as they were)."""
    if not isinstance(plan, HashPlan):
        raise TypeError(f"plan must be a HashPlan (from hash_plan), got {type(plan).__name__}")
    xp = np if type(raw) is np.ndarray and (out is None or type(out) is np.ndarray) else \
        array_module(raw=raw) if out is None else array_module(raw=raw, out=out)
    plan.check_raw(raw, np.int64)
    rows = plan.writes
    if out is None:
        out = xp.empty((rows, raw.shape[1]), dtype=np.int64)
    elif out.dtype != np.int64 or out.ndim != 2 or out.shape[0] < rows or out.shape[1] != raw.shape[1] \
            or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous int64 array of at least {rows} rows of {raw.shape[1]}, got "
                         f"{out.dtype} {out.shape}")
    raw = xp.ascontiguousarray(raw)
    keys, width = plan.sources.shape
    if not keys:
        return out
    if xp is not np:
        sources, seeds, buckets, targets = plan.on_device(xp)
        n = keys * raw.shape[1]
        launch("hash_fixed.cu", "fl_hash_columns", n,
               (raw, np.int64(raw.shape[1]), sources, np.int32(width), seeds, buckets, targets, np.int64(keys), out))
        return out
    native = kernels("murmur3")
    if native is not None and width == 1:
        native.hash_columns(raw.view(np.uint32), plan.flat_sources, plan.num_buckets, plan.seeds, plan.targets, out)
    elif native is not None:
        native.cross_columns(raw.view(np.uint32), np.ascontiguousarray(plan.sources[:, 0]),
                             np.ascontiguousarray(plan.sources[:, 1]),
                             plan.num_buckets, plan.seeds, plan.targets, out)
    else:
        for (a, *b), n, seed, target in zip(plan.sources.tolist(), plan.num_buckets.tolist(), plan.seeds.tolist(),
                                            plan.targets.tolist()):
            out[target] = hash_buckets(raw[a], n, seed) if not b else cross(raw[a], raw[b[0]], n, seed)
    return out
