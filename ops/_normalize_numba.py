"""``normalize_dense`` for many columns at once on the CPU (numba): the twin of ``normalize_dense.cu`` and of
``normalize_values.py`` with ``log1p64.py``, which stay its reference.

The log1p follows ``log1p64.py`` step for step in float64 (same operations, same order, nothing fused), with
``frexp`` done on the bits (exact for the positive normal values ``1 + y`` takes), so that the loops vectorise.

Dense features are mostly small whole counts: ``normalize_columns`` looks the log1p of a whole value in
``[+0, len(table))`` up in a table of ``log1p_float32`` made by ``log1p_table`` (the very function, so the same
bits) and computes it only for the values outside it.
"""
from __future__ import annotations

import numpy as np
from numba.core import types
from numba.extending import intrinsic

from ._numba import helper, kernel
from .log1p64 import HORNER_COEFFS, LN2, SQRT_HALF, TINY

P0, P1, P2, P3, P4, P5, P6, P7, P8, P9 = HORNER_COEFFS
EXPONENT = np.int64(0x7FF << 52)
HALF = np.int64(1022 << 52)  # the exponent field of a value in [0.5, 1)
NAN32 = np.float32(np.nan)
INF32 = np.float32(np.inf)


def _bitcast(source, target):
    """An intrinsic reading a ``source`` value's bits as a ``target`` value."""
    @intrinsic
    def cast(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))
        return target(source), codegen
    return cast


_bits_of, _float_of = _bitcast(types.float64, types.int64), _bitcast(types.int64, types.float64)
_bits32_of = _bitcast(types.float32, types.int32)


@helper
def log1p_float32(y32):
    """``log1p64.log1p_float32`` of one float32 value."""
    y = np.float64(y32)
    u = y + 1.0
    bits = _bits_of(u)
    e = ((bits >> 52) & 0x7FF) - 1022
    m = _float_of((bits & ~EXPONENT) | HALF)  # u = m * 2**e, m in [0.5, 1)
    if m < SQRT_HALF:
        m = m + m
        e = e - 1
    k = np.float64(e)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    p = P9
    p = p * z + P8
    p = p * z + P7
    p = p * z + P6
    p = p * z + P5
    p = p * z + P4
    p = p * z + P3
    p = p * z + P2
    p = p * z + P1
    p = p * z + P0
    r = np.float32(k * LN2 + (s + s) * p)
    if abs(y) < TINY:
        r = y32
    if y == -1.0:
        r = -INF32
    if y < -1.0 or y != y:
        r = NAN32
    if y == np.inf:
        r = INF32
    return r


BLOCK_BYTES = 24576  # the rows of out normalised together: within L1, so that its columns' strided writes hit it


@kernel
def log1p_table(out):
    """``out[v] = log1p_float32(v)`` for v = 0, 1, ... (out float32)."""
    for v in range(out.shape[0]):
        out[v] = log1p_float32(np.float32(v))


@kernel
def normalize_columns(raw, sources, fill, clip, log, table, out):
    """``out[:, j] = normalize_dense(raw[sources[j]], fill[j], clip[j], log[j])``: raw float32 [R, B], out
    float32 [B, J]; ``clip[j]`` -inf means no clipping; ``table`` from ``log1p_table`` (at most 2**31 values)."""
    batch = raw.shape[1]
    size = np.float32(table.shape[0])
    zero = np.float32(0.0)
    step = max(16, min(512, BLOCK_BYTES // (4 * max(1, sources.shape[0]))))
    index = np.empty(min(batch, step), dtype=np.int32)
    for start in range(0, batch, step):  # a block of rows at a time (see BLOCK_BYTES)
        stop = min(start + step, batch)
        rows = stop - start
        block = out[start:stop]
        for j in range(sources.shape[0]):
            source = raw[sources[j], start:stop]
            f = fill[j]
            c = clip[j]
            if log[j]:
                misses = 0
                for i in range(rows):  # where the table holds the value, its index; else 0, counted as a miss
                    y = source[i]
                    y = f if y != y else y
                    y = c if y < c else y
                    inside = (_bits32_of(y) >= 0) & (y < size)  # (not -0.0, whose log1p is -0.0)
                    v = np.int32(y if inside else zero)
                    index[i] = v
                    misses += np.int32(0 if inside & (np.float32(v) == y) else 1)
                for i in range(rows):
                    block[i, j] = table[np.uint32(index[i])]
                i = 0
                while misses:  # (a loop of unknown count: not vectorised, so only the misses compute log1p)
                    y = source[i]
                    y = f if y != y else y
                    y = c if y < c else y
                    if not (_bits32_of(y) >= 0 and y < size and np.float32(np.int32(y)) == y):
                        y = log1p_float32(y)
                        block[i, j] = NAN32 if y != y else y
                        misses -= 1
                    i += 1
            else:
                for i in range(rows):
                    y = source[i]
                    y = f if y != y else y
                    y = c if y < c else y
                    block[i, j] = NAN32 if y != y else y
