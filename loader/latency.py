"""The trainer's thread asks Linux for a short time slice while it takes feedline's batches.

When feedline's threads keep both cores busy (the trainer sets the pace, so the loader runs flat out), the
trainer's thread wakes from its step (a CUDA synchronisation, a sleep) onto a core that a loader thread holds.
Linux's EEVDF scheduler (6.6+) lets the running thread finish its slice first (RUN_TO_PARITY; 1.4 ms on a 2-core
machine), so every step overran by up to that, on average 0.3-1.6 ms on 2 busy cores against ~2-3 ms Criteo
steps. A thread with a custom slice shorter than the running one's preempts it on wake-up (PREEMPT_SHORT, 6.12+):
the trainer then gets its core at once, while its share of the CPU (its weight, its nice) is unchanged, so it
takes nothing from other processes. The slice is a latency hint (sched_setattr's ``sched_runtime`` for a normal
thread, no privilege needed); a kernel without custom slices ignores it, other systems are not asked.
The thread's own slice is put back when the stream that set it closes.

``FEEDLINE_TRAINER_SLICE``: unset or ``1`` asks for the short slice, ``0`` leaves the trainer's thread as it is; any
other value is a ``ValueError`` when a stream would ask (``off``, ``no``, ``false``... are refused rather than read
as either)."""
from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading

SLICE_NS = 100_000  # the shortest the kernel takes
_ENV = "FEEDLINE_TRAINER_SLICE"
_SWITCH = {"1": True, "0": False}  # unset: "1"
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}  # (sched_setattr, sched_getattr)
_ATTR_SIZE = 48  # SCHED_ATTR_SIZE_VER0


class _Attr(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64),
                ("nice", ctypes.c_int32), ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64)]


def _syscall():
    if not sys.platform.startswith("linux") or platform.machine() not in _SYSCALLS:
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None


_call = _syscall()
_lock = threading.Lock()
_held: dict[int, list] = {}  # thread id -> [its own slice, holders]


def asked() -> bool:
    """Whether ``FEEDLINE_TRAINER_SLICE`` asks for the short slice: unset or ``"1"`` yes, ``"0"`` no; any other
    value is a ``ValueError`` naming the variable, the value and what it takes."""
    value = os.environ.get(_ENV, "1")
    if value not in _SWITCH:
        raise ValueError(f"{_ENV} must be '1' (the trainer's thread gets a short scheduler slice, the default when "
                         f"unset) or '0' (leave it as it is), got {value!r}")
    return _SWITCH[value]


def enabled() -> bool:
    """Whether a stream asks for the short slice: asked for (:func:`asked`) and possible here."""
    return asked() and _call is not None


def _get(tid: int) -> _Attr | None:
    attr = _Attr()
    if _call(_SYSCALLS[platform.machine()][1], tid, ctypes.byref(attr), _ATTR_SIZE, 0) != 0:
        return None
    return attr


def _set(tid: int, attr: _Attr, runtime: int) -> bool:
    new = _Attr(size=_ATTR_SIZE, policy=attr.policy, flags=0, nice=attr.nice, priority=attr.priority,
                runtime=runtime)
    return _call(_SYSCALLS[platform.machine()][0], tid, ctypes.byref(new), 0) == 0


def shorten(tid: int) -> bool:
    """Give thread ``tid`` (a native id) the short slice; True when it has it (then :func:`restore` once)."""
    if not enabled():
        return False
    with _lock:
        held = _held.get(tid)
        if held is not None:
            held[1] += 1
            return True
        attr = _get(tid)
        if attr is None or attr.policy != 0 or not _set(tid, attr, SLICE_NS):  # SCHED_OTHER only
            return False
        _held[tid] = [attr.runtime, 1]
        return True


def restore(tid: int) -> None:
    """Undo one :func:`shorten` of ``tid``: its own slice back once no stream holds it (if it still has ours)."""
    with _lock:
        held = _held.get(tid)
        if held is None:
            return
        held[1] -= 1
        if held[1] > 0:
            return
        del _held[tid]
        attr = _get(tid)
        if attr is not None and attr.runtime == SLICE_NS:
            _set(tid, attr, held[0])


def slice_ns(tid: int) -> int | None:
    """Thread ``tid``'s slice (ns), None where it cannot be read."""
    if _call is None:
        return None
    attr = _get(tid)
    return None if attr is None else int(attr.runtime)
