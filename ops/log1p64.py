"""A log1p for float32 values that NumPy and CUDA compute bit-identically (see ``log1p64.cuh``).

Library log1p functions (glibc, CUDA's libdevice) are accurate to about 1 ulp but not correctly
rounded and not identical, so they could disagree after rounding to float32. This one uses only
IEEE-754 operations that are correctly rounded on both sides (+, -, *, / in float64, exact frexp
and float64 -> float32 round-to-nearest-even), in the same order; the kernel is compiled with
``--fmad=false`` and uses ``__dadd_rn``/``__dmul_rn``/``__ddiv_rn`` so nothing is fused. Equal
inputs therefore give equal bits by construction.

For float32 y (y > -1, finite):
  * |y| < 2**-29: result y (log1p(y) rounds to y in float32).
  * u = 1 + y in float64 (exact for 2**-29 <= |y| < 2**53; for larger y the lost 1 is far below
    float32 precision); u = 2**k * m with m in [sqrt(1/2), sqrt(2)); f = m - 1 (exact);
    s = f / (2 + f); log(m) = 2 s (1 + z/3 + z**2/5 + ... + z**9/19) with z = s*s (Horner, truncation
    error < 2**-55 as |s| <= 0.1716); result = float32(k * ln2 + (s + s) * P(z)).
  * y == -1 -> -inf; y < -1 or NaN -> NaN; y == +inf -> +inf.
The result is within one float32 ulp of the exact log1p (correctly rounded except when the exact value
lies within a few float64 ulps of a float32 rounding midpoint).
"""

from __future__ import annotations

import numpy as np

# The .cuh file spells these as hexadecimal literals; tests/test_cuda_sources.py checks they agree.
HORNER_COEFFS = tuple(1.0 / (2 * n + 1) for n in range(10))
SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
LN2 = float.fromhex("0x1.62e42fefa39efp-1")
TINY = 2.0**-29
CHUNK = 65536


def log1p_float32(y: np.ndarray) -> np.ndarray:
    """Elementwise log1p of a float32 array, returned as float32 (definition in module docstring)."""
    y = np.asarray(y, dtype=np.float32)
    flat = y.reshape(-1)
    out = np.empty(flat.shape, dtype=np.float32)
    with np.errstate(all="ignore"):
        for start in range(0, flat.shape[0], CHUNK):
            chunk = flat[start : start + CHUNK]
            out[start : start + CHUNK] = _log1p_chunk(chunk)
    return out.reshape(y.shape)


def _log1p_chunk(y32: np.ndarray) -> np.ndarray:
    y = y32.astype(np.float64)
    u = y + 1.0
    m, e = np.frexp(u)
    low = m < SQRT_HALF
    m = np.where(low, m + m, m)
    k = (e - low).astype(np.float64)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    p = np.full_like(z, HORNER_COEFFS[-1])
    for c in HORNER_COEFFS[-2::-1]:
        p *= z
        p += c
    r = (k * LN2 + (s + s) * p).astype(np.float32)
    tiny = np.abs(y) < TINY
    r[tiny] = y32[tiny]
    r[y == -1.0] = -np.inf
    r[(y < -1.0) | np.isnan(y)] = np.nan
    r[y == np.inf] = np.inf
    return r
