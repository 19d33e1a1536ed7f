"""The loader's own threads run below the trainer's: a larger nice value than the process's main thread (Linux,
where nice is per thread), so that a trainer thread waking from its step gets a core at once.

Why: with every core busy making batches, a thread waking from a sleep (a trainer back from waiting on its GPU)
does not take a core from a thread of the same nice that is still within its time slice: it waits for the slice
to end, which a tick (4 ms at HZ=250) may be the first to notice. A thread of a larger nice is passed over at
once. ``time.sleep(3.3 ms)`` on the main thread beside two threads running GIL-free kernels (2 cores, others
running): median overrun 4.6-8.7 ms with the threads at the main thread's nice, 0.06-0.12 ms at nice +10 or +19
(three alternating rounds).

The batch thread sits between: above the worker threads it waits for (it hands their batches over, and a
trainer waiting for a batch waits for it), below the trainer. The main thread is never changed, nor a thread
that is already lower (a thread starts at its creator's nice), and nothing is raised where it cannot be done.
"""
from __future__ import annotations

import os
import sys
import threading

MAX_NICE = 19
BATCH_THREAD = 5  # the thread that hands batches to the trainer
WORKER_THREADS = 10  # the threads that make them


def lower_this_thread(by: int) -> bool:
    """Give the calling thread the main thread's nice plus ``by`` (at most 19) if it is higher in priority than
    that; whether it was changed. Only on Linux, never the main thread, never an error (a sandbox may forbid it)."""
    if by <= 0 or not sys.platform.startswith("linux") or threading.current_thread() is threading.main_thread():
        return False
    try:
        tid = threading.get_native_id()
        target = min(os.getpriority(os.PRIO_PROCESS, os.getpid()) + by, MAX_NICE)  # (pid: the main thread's nice)
        if os.getpriority(os.PRIO_PROCESS, tid) >= target:
            return False
        os.setpriority(os.PRIO_PROCESS, tid, target)
        return True
    except (OSError, AttributeError):
        return False
