"""``bucketize``: ``numpy.digitize(x, boundaries, right=False)`` on NumPy or CuPy arrays.

For increasing boundaries, bucket i means ``boundaries[i-1] <= x < boundaries[i]`` (0 below the first,
len(boundaries) at or above the last); decreasing boundaries mirror this as in NumPy. NaN goes to
len(boundaries) for increasing and 0 for decreasing boundaries. ``x`` and ``boundaries`` are compared
in ``numpy.result_type`` of the two (as NumPy does: int64 against float64 compares in float64).
Boundaries containing NaN are rejected (NumPy accepts some such inputs with arbitrary results).
"""

from __future__ import annotations

import numpy as np

from ._arrays import array_module
from ._cuda import launch


def bucketize(x, boundaries):
    """int64 bucket index of each element of ``x`` (any shape) against 1-D monotone ``boundaries``."""
    xp = array_module(x=x, boundaries=boundaries)
    x = xp.asarray(x)
    bounds = xp.asarray(boundaries)
    for name, array in (("x", x), ("boundaries", bounds)):
        if array.dtype.kind not in "biuf":
            raise TypeError(f"{name} must have a bool, integer or float dtype, got dtype {array.dtype}")
    if bounds.ndim != 1:
        raise ValueError(f"boundaries must be 1-D, got shape {bounds.shape}")
    common = np.result_type(x.dtype, bounds.dtype)
    host_bounds = bounds if xp is np else xp.asnumpy(bounds)  # small; checked exactly on the host
    if common.kind == "f" and bool(np.isnan(host_bounds).any()):
        raise ValueError("boundaries must not contain NaN")
    descending = _is_descending(host_bounds.astype(common))
    if xp is np:
        return np.asarray(np.digitize(x, bounds, right=False), dtype=np.int64)  # 0-d stays an array
    return _bucketize_gpu(xp, x, bounds, common, descending)


def _is_descending(bounds: np.ndarray) -> bool:
    if bounds.shape[0] < 2:
        return False
    steps_up = bounds[1:] >= bounds[:-1]
    if bool(steps_up.all()):
        return False
    if bool((bounds[1:] <= bounds[:-1]).all()):
        return True
    raise ValueError("boundaries must be monotonically increasing or decreasing")


def _bucketize_gpu(cp, x, bounds, common: np.dtype, descending: bool):
    xs, x_suffix = _kernel_operand(cp, x, common)
    bs, b_suffix = _kernel_operand(cp, bounds, common)
    out = cp.empty(x.shape, dtype=np.int64)
    n = xs.size
    launch("bucketize.cu", f"fl_bucketize_{x_suffix}_{b_suffix}", n,
           (xs, np.int64(n), bs, np.int64(bs.shape[0]), np.int32(descending), out))
    return out


def _kernel_operand(cp, array, common: np.dtype):
    """``array`` in a type the kernel reads, converted as NumPy converts it to ``common``.

    Floats are compared as float64 in the kernel; float32/float64 stay as they are, because CuPy's
    own float32 casts flush subnormals. Other types become float64 (exact, or rounded as NumPy rounds
    int64 to float64), or int64/uint64 when ``common`` is an integer type.
    """
    if common.kind == "f":
        if array.dtype == np.float32:
            return cp.ascontiguousarray(array), "f32"
        return cp.ascontiguousarray(array, dtype=np.float64), "f64"
    if common == np.uint64:
        return cp.ascontiguousarray(array, dtype=np.uint64), "u64"
    return cp.ascontiguousarray(array, dtype=np.int64), "i64"
