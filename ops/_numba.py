"""How the CPU kernels are compiled with numba. Only the kernel modules (``_*_numba.py``) import this, and
``_native.kernels`` imports those on first use, so ``import feedline.ops`` needs neither numba nor its compile
time.

Every kernel is ``nogil`` (the loader's threads run it side by side), uses NumPy's error model (a float
division by zero gives inf or NaN as in NumPy instead of raising), and never ``fastmath``: no reassociation and
no contraction of ``a * b + c`` into a fused multiply-add, so float results equal NumPy's bit for bit.

Compiled code is cached on disk where numba finds a writable place: ``NUMBA_CACHE_DIR`` when set, else the
package's ``__pycache__``, else the user's cache folder (``~/.cache/numba``). Where none is writable the
kernels compile on each start (about a second each, paid by the first batch).

A kernel found in that cache is loaded without numba's ``refresh`` of its target context (``fast_loading``): numba
refreshes before every cache load, and the first refresh of a process imports every implementation numba has
(arrays, typed containers, dates, linear algebra and, through numba's BLAS check, ``scipy.linalg``): ~0.45 s of
one core holding the GIL and numba's compile lock, before the first kernel can run. Loading a compiled kernel
needs only numba's runtime (NRT) set up, which is what this does; the modules a kernel's code came from are
imported as its cached environment names them. A compile (a cache miss, or a user's own numba function) still
refreshes as numba always does, so nothing else in the process sees a difference.
"""
from __future__ import annotations

import numba

OPTIONS = {"nogil": True, "error_model": "numpy"}


def kernel(function):
    """``function`` compiled as a cached, GIL-free numba kernel (uncached where no cache folder is writable)."""
    try:
        return fast_loading(numba.njit(cache=True, **OPTIONS)(function))
    except RuntimeError:  # numba found no writable cache location
        return numba.njit(cache=False, **OPTIONS)(function)


def helper(function):
    """A function the kernels of the same module call (compiled into them: keep helpers beside their kernels,
    since numba's cache checks only the calling kernel's own file for changes)."""
    return numba.njit(**OPTIONS)(function)


def fast_loading(dispatcher):
    """``dispatcher`` (a cached ``numba.njit`` function, nopython, no ``objmode``, not ``parallel``) with its
    cache loading compiled code without refreshing numba's target context (see the module's docstring). The
    cache files, their keys and what is compiled are numba's own. Where this numba's cache is not the one this
    was written for, the dispatcher is left as it is."""
    cache = getattr(dispatcher, "_cache", None)
    quick = _quick_cache_class()
    if quick is not None and type(cache) is quick.__bases__[0]:
        dispatcher._cache = quick(dispatcher.py_func)
    return dispatcher


_QUICK: list = []


def _quick_cache_class():
    if not _QUICK:
        _QUICK.append(_make_quick_cache_class())
    return _QUICK[0]


def _make_quick_cache_class():
    try:
        from numba.core.caching import FunctionCache
        from numba.core.runtime.nrt import rtsys
    except ImportError:
        return None
    if not all(hasattr(FunctionCache, name) for name in ("_load_overload", "_guard_against_spurious_io_errors")) \
            or not hasattr(rtsys, "initialize"):
        return None

    class QuickFunctionCache(FunctionCache):
        """numba's ``FunctionCache`` whose ``load_overload`` sets up the runtime (NRT) the compiled code calls
        instead of refreshing the whole target context (the rest of ``Cache.load_overload`` as numba has it)."""

        def load_overload(self, sig, target_context):
            rtsys.initialize(target_context)  # idempotent; numba's refresh starts with this same call
            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)

    return QuickFunctionCache
