"""``normalize_dense``: fill missing, clip from below, log1p; float32, bit-identical on CPU and GPU.

Definition, per element (all comparisons exact; fill_value and clip_min are first rounded to float32):
  1. x is converted to float32 (round to nearest even);
  2. NaN (missing) -> fill_value;
  3. if clip_min is not None and x < clip_min: x = clip_min;
  4. if log: x = log1p(x), computed by ``log1p64.log1p_float32`` (a float64 evaluation using only
     correctly rounded IEEE operations, rounded once to float32; within 1 float32 ulp of exact).
     -1 -> -inf, below -1 -> NaN;
  5. any NaN result is written as the canonical quiet NaN 0x7fc00000.
"""

from __future__ import annotations

import math

import numpy as np

from ._arrays import array_module
from ._cuda import launch
from .log1p64 import log1p_float32


def normalize_dense(x, fill_value: float = 0.0, clip_min: float | None = 0.0, log: bool = True):
    """float32 array of the same shape and array kind as ``x`` (definition in module docstring)."""
    xp = array_module(x=x)
    x = xp.asarray(x)
    if x.dtype.kind not in "iuf":
        raise TypeError(f"x must have an integer or float dtype, got dtype {x.dtype}")
    fill = _float32_arg("fill_value", fill_value)
    clip = None if clip_min is None else _float32_arg("clip_min", clip_min)
    if clip is not None and math.isnan(clip):
        raise ValueError("clip_min must not be NaN (use None for no clipping)")
    if not isinstance(log, (bool, np.bool_)):
        raise TypeError(f"log must be a bool, got {type(log).__name__} {log!r}")
    if xp is np:
        return _normalize_cpu(x.astype(np.float32), fill, clip, bool(log))
    # CuPy compiles its own casts with -ftz=true, so float -> float32 rounding happens in the kernel.
    if x.dtype.kind == "f" and x.dtype != np.float32:
        source, kernel = xp.ascontiguousarray(x, dtype=np.float64), "fl_normalize_dense_f64"
    else:
        source, kernel = xp.ascontiguousarray(x, dtype=np.float32), "fl_normalize_dense_f32"
    out = xp.empty(x.shape, dtype=np.float32)
    n = out.size
    launch("normalize_dense.cu", kernel, n,
           (source, np.int64(n), np.float64(fill), np.float64(0.0 if clip is None else clip),
            np.int32(clip is not None), np.int32(bool(log)), out))
    return out


def _float32_arg(name: str, value: object) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__} {value!r}")
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def _normalize_cpu(y: np.ndarray, fill: float, clip: float | None, log: bool) -> np.ndarray:
    y[np.isnan(y)] = fill
    if clip is not None:
        y[y < np.float32(clip)] = clip
    if log:
        y = log1p_float32(y)
    y[np.isnan(y)] = np.nan
    return y
