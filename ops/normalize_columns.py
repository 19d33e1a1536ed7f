"""``normalize_columns``: ``normalize_dense`` of several columns of a batch in one pass, each with its own fill,
clip and log1p, from a feature-major float32 batch into a row-major block (a batch's ``dense`` output).

Definition: ``out[:, j] = normalize_dense(raw[sources[j]], fill[j], clip_min[j], log[j])`` bit for bit
(``normalize_dense`` is its reference). On the CPU it runs as a GIL-free numba kernel (NumPy where numba is
missing), on the GPU as one CUDA kernel.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ._arrays import array_module
from ._cuda import launch
from ._native import kernels
from ._raw_plan import RawRowsPlan
from .normalize_values import _float32_arg, normalize_dense


@dataclass(frozen=True, eq=False)
class DensePlan(RawRowsPlan):
    """Columns to normalise (validated by :func:`dense_plan`): ``sources`` int64 [J], ``fill`` float32 [J],
    ``clip_min`` float32 [J] (-inf where there is no clipping), ``clip`` bool [J], ``log`` bool [J]."""

    sources: np.ndarray
    fill: np.ndarray
    clip_min: np.ndarray
    clip: np.ndarray
    log: np.ndarray
    _device: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return self.sources.shape[0]

    def on_device(self, cupy) -> tuple:
        """(sources, fill, clip_min, flags) on the current device, copied there once; flags int32: bit 0 clip,
        bit 1 log1p."""
        return self._copied(cupy, lambda: (self.sources, self.fill, self.clip_min,
                                           self.clip.astype(np.int32) | (self.log.astype(np.int32) << 1)))


def dense_plan(sources, fill: Sequence[float], clip_min: Sequence[float | None], log: Sequence[bool]) -> DensePlan:
    """Validate the columns of :func:`normalize_columns`: raw rows ``sources`` and, per column, ``fill``,
    ``clip_min`` (None: no clipping) and ``log`` as ``normalize_dense`` takes them."""
    sources = np.asarray(sources)
    if sources.dtype.kind not in "iu" and sources.size:
        raise TypeError(f"sources must hold integers, got dtype {sources.dtype}")
    sources = np.ascontiguousarray(sources, dtype=np.int64).reshape(-1)
    if sources.size and sources.min() < 0:
        raise ValueError(f"sources must be raw rows (>= 0), got {sources.tolist()}")
    j = sources.size
    fill, clip_min, log = list(fill), list(clip_min), list(log)
    for name, values in (("fill", fill), ("clip_min", clip_min), ("log", log)):
        if len(values) != j:
            raise ValueError(f"{name} must have one entry per column ({j}), got {len(values)}")
    fills = np.array([_float32_arg("fill", f) for f in fill], dtype=np.float32)
    clips = np.array([-math.inf if c is None else _float32_arg("clip_min", c) for c in clip_min], dtype=np.float32)
    if np.isnan(clips).any():
        raise ValueError("clip_min must not be NaN (use None for no clipping)")
    for value in log:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"log must hold bools, got {type(value).__name__} {value!r}")
    return DensePlan(sources, fills, clips, np.array([c is not None for c in clip_min], dtype=bool),
                     np.array(log, dtype=bool))


LOG1P_TABLE_SIZE = 65536  # whole values 0..65535: 256 KiB, most of Criteo's counts


@functools.lru_cache(maxsize=None)
def _log1p_table(native) -> np.ndarray:
    """log1p of the whole values ``0..LOG1P_TABLE_SIZE - 1``, made once by the kernels' own log1p (same bits)."""
    table = np.empty(LOG1P_TABLE_SIZE, dtype=np.float32)
    native.log1p_table(table)
    table.flags.writeable = False
    return table


def normalize_columns(raw, plan: DensePlan, out=None):
    """``raw`` float32 [rows, B] (NaN = missing; NumPy or CuPy) -> ``out`` float32 [B, len(plan)] (allocated
    when None; C-contiguous)."""
    if not isinstance(plan, DensePlan):
        raise TypeError(f"plan must be a DensePlan (from dense_plan), got {type(plan).__name__}")
    xp = np if type(raw) is np.ndarray and (out is None or type(out) is np.ndarray) else \
        array_module(raw=raw) if out is None else array_module(raw=raw, out=out)
    plan.check_raw(raw, np.float32)
    columns = plan.sources.shape[0]
    shape = (raw.shape[1], columns)
    if out is None:
        out = xp.empty(shape, dtype=np.float32)
    elif out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {shape}, got {out.dtype} {out.shape}")
    raw = xp.ascontiguousarray(raw)
    if not columns or not raw.shape[1]:
        return out
    if xp is not np:
        sources, fill, clip_min, flags = plan.on_device(xp)
        launch("normalize_dense.cu", "fl_normalize_columns", out.size,
               (raw, np.int64(raw.shape[1]), sources, fill, clip_min, flags, np.int64(columns), out))
        return out
    native = kernels("normalize")
    if native is not None:
        native.normalize_columns(raw, plan.sources, plan.fill, plan.clip_min, plan.log, _log1p_table(native), out)
        return out
    for j, (source, f, c, clip, log) in enumerate(zip(plan.sources.tolist(), plan.fill.tolist(),
                                                      plan.clip_min.tolist(), plan.clip.tolist(), plan.log.tolist())):
        out[:, j] = normalize_dense(raw[source], f, c if clip else None, log)
    return out
