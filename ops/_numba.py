"""How the CPU kernels are compiled with numba. Only the kernel modules (``_*_numba.py``) import this, and
``_native.kernels`` imports those on first use, so ``import feedline.ops`` needs neither numba nor its compile
time.

Every kernel is ``nogil`` (the loader's threads run it side by side), uses NumPy's error model (a float
division by zero gives inf or NaN as in NumPy instead of raising), and never ``fastmath``: no reassociation and
no contraction of ``a * b + c`` into a fused multiply-add, so float results equal NumPy's bit for bit.

Compiled code is cached on disk where numba finds a writable place: ``NUMBA_CACHE_DIR`` when set, else the
package's ``__pycache__``, else the user's cache folder (``~/.cache/numba``). Where none is writable the
kernels compile on each start (about a second each, paid by the first batch).
"""
from __future__ import annotations

import numba

OPTIONS = {"nogil": True, "error_model": "numpy"}


def kernel(function):
    """``function`` compiled as a cached, GIL-free numba kernel (uncached where no cache folder is writable)."""
    try:
        return numba.njit(cache=True, **OPTIONS)(function)
    except RuntimeError:  # numba found no writable cache location
        return numba.njit(cache=False, **OPTIONS)(function)


def helper(function):
    """A function the kernels of the same module call (compiled into them: keep helpers beside their kernels,
    since numba's cache checks only the calling kernel's own file for changes)."""
    return numba.njit(**OPTIONS)(function)
