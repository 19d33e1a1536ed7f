"""Threads of feedline's that are ending, joined before the interpreter finalises.

A daemon thread still running when CPython finalises is stopped the next time it asks for the GIL, by
``pthread_exit``. A thread freeing a batch's tensors asks for it inside torch's C++ deallocation (which releases the
GIL), and unwinding those C++ frames aborts the whole process after the trainer's last line: "terminate called
without an active exception". A batch thread or a pool worker lets go of its batches as it ends (its stream, its
queue, the masks it kept), also after its stream was dropped, so that every such thread is joined at exit
(:func:`join_all`, run by the batch threads' exit hook), not only the threads of the streams still open."""
from __future__ import annotations

import threading
import time
from typing import Iterable

_lock = threading.Lock()
_threads: set[threading.Thread] = set()


def join_at_exit(threads: Iterable[threading.Thread]) -> None:
    """Have :func:`join_all` wait for ``threads``: threads that end on their own (told to stop, or at the end of
    their work), never one that waits for work forever."""
    with _lock:
        _threads.difference_update([t for t in _threads if not t.is_alive()])
        _threads.update(threads)


def join_all(timeout_s: float) -> list[threading.Thread]:
    """Wait up to ``timeout_s`` in all for every thread given to :func:`join_at_exit` (but the calling one); returns
    those still alive after it."""
    deadline = time.monotonic() + timeout_s
    with _lock:
        waiting = [t for t in _threads if t is not threading.current_thread()]
    for thread in waiting:
        thread.join(max(deadline - time.monotonic(), 0.0))
    with _lock:
        _threads.difference_update([t for t in waiting if not t.is_alive()])
    return [t for t in waiting if t.is_alive()]
