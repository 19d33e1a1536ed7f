"""The simulated trainer's step as a sleep that notes when the thread woke, before it takes the GIL back.

On Linux, ``time.sleep(s)`` is ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, now + s)`` with the GIL
released; once woken, the thread takes the GIL back before Python runs again. A step that ends late is late for
two reasons, which ``time.sleep`` cannot tell apart: the OS woke the thread late (other threads held its core),
or another thread held the GIL. :func:`sleeper` gives the same sleep in a GIL-free numba function that reads
``CLOCK_MONOTONIC`` (``time.perf_counter``'s clock) the moment it wakes: the step's ``woke late`` is that stamp
minus the deadline, its GIL wait is Python running again minus that stamp.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import time
from typing import Callable

import numpy as np
from numba import types

from ..ops._numba import kernel

# struct timespec {time_t tv_sec; long tv_nsec;} as two int64 where long is 64-bit (checked in usable())
_clock_nanosleep = types.ExternalFunction("clock_nanosleep", types.intc(types.intc, types.intc, types.voidptr,
                                                                       types.voidptr))
_clock_gettime = types.ExternalFunction("clock_gettime", types.intc(types.intc, types.voidptr))
_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", 1)
_ABSOLUTE = 1  # TIMER_ABSTIME
_EINTR = 4
_PERF_COUNTER = "clock_gettime(CLOCK_MONOTONIC)"


def _sleep_until(deadline_ns):
    spec = np.empty(2, dtype=np.int64)
    spec[0], spec[1] = deadline_ns // 1_000_000_000, deadline_ns % 1_000_000_000
    while _clock_nanosleep(_MONOTONIC, _ABSOLUTE, spec.ctypes, 0) == _EINTR:
        pass  # a signal: sleep on to the same deadline (Python handles it once the thread runs Python again)
    _clock_gettime(_MONOTONIC, spec.ctypes)
    return spec[0] * 1_000_000_000 + spec[1]


def usable(platform: str, clock: str, long_bytes: int) -> bool:
    """Whether the native sleep is ``time.sleep``'s and its stamp is ``time.perf_counter``'s clock: Linux (the
    clock ids and ``TIMER_ABSTIME`` above are Linux's), ``perf_counter`` reading ``clock_gettime(CLOCK_MONOTONIC)``
    (``time.get_clock_info``) and a 64-bit ``long`` (the layout of ``struct timespec`` above)."""
    return platform.startswith("linux") and clock == _PERF_COUNTER and long_bytes == 8


def sleeper() -> Callable[[int], int] | None:
    """``sleep_until(deadline_ns) -> woke_ns``: sleeps to ``deadline_ns`` (``time.perf_counter_ns``'s clock) with
    the GIL released, as ``time.sleep`` does, and returns that clock read the moment the thread woke, before it
    waited for the GIL. None where that cannot be done here (not Linux, another clock, numba unable to call libc's
    ``clock_nanosleep``/``clock_gettime``). Compiled, or loaded from numba's disk cache, on the first call: call
    it before any clock starts."""
    if not usable(sys.platform, time.get_clock_info("perf_counter").implementation, ctypes.sizeof(ctypes.c_long)):
        return None
    return _compiled()


@functools.cache
def _compiled() -> Callable[[int], int] | None:
    # Built here, not at import: the library's kernels are counted as module globals that numba compiled
    # (numba_compiles), and this is the trainer's own, compiled before any round's clock starts.
    try:
        sleep_until = kernel(_sleep_until)
        sleep_until(0)  # a deadline long past: compiles (or loads) and checks that the symbols resolve
    except Exception:  # noqa: BLE001 - numba's typing and linking errors have no common class
        return None
    return sleep_until
