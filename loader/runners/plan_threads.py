"""Worker threads that make batch plans' host parts ahead of the thread that delivers them.

Up to ``depth`` plans are in flight: each thread finds its next plan queued when it finishes one, so it need
not be woken (a wake-up is a system call made holding the GIL, and costly on virtual machines); the batch
thread is woken only for the plan it waits for (``_Doorbell``).

A caller may also ask for plans to be warmed ``ahead`` plans before they are made (``warm``): each plan, as it
is taken from the iterator, is warmed (what it will need read into a cache) by the task of the next plan made,
before that plan, so that work a plan would do in one burst (the chunks of a new shuffle buffer-full) is spread
over the plans before it. One task a plan, not two: each task is a future made, queued and finished holding
the GIL.
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator

from ..sampler import BatchPlan
from ..wake_pipe import WakePipe

THREAD_PREFIX = "feedline-features"


def may_join() -> bool:
    """Whether this thread may wait for a pool's workers. A stream dropped in a reference cycle is closed by
    the garbage collector on whatever thread runs it: one of the pool's own (which cannot join itself), or a
    thread still starting inside the threading module (seen as a dummy thread; joining there deadlocks on
    the module's own lock). Those leave the workers to finish on their own."""
    current = threading.current_thread()
    return not isinstance(current, threading._DummyThread) and not current.name.startswith(THREAD_PREFIX)


class _Doorbell(WakePipe):
    """How a worker tells the batch thread that the batch it waits for is done: a ring of the pipe, and only
    while it waits for that very batch (``wait_for``), so that batches finished ahead of time wake nobody (a
    ``Future``'s ``result()`` would wake it holding the GIL, once per batch)."""

    def __init__(self):
        super().__init__()
        self._watched = None

    def ring(self, future=None) -> None:
        if future is not None and future is not self._watched:
            return
        super().ring()

    def wait_for(self, future) -> None:
        """Until ``future`` is done (its callback rings the bell once it is watched; a ring may be spurious)."""
        self._watched = future  # set before looking: a worker finishing now then sees it and rings
        while not future.done():
            self.wait()
        self._watched = None


class PlanThreads:
    """``num_threads`` worker threads running ``work(plan)`` for up to ``depth`` plans ahead."""

    def __init__(self, num_threads: int, depth: int):
        self.num_threads = num_threads
        self.depth = depth
        self._pool: ThreadPoolExecutor | None = None

    def run(self, plans: Iterator[BatchPlan], work: Callable[[BatchPlan], Any], *,
            warm: Callable[[BatchPlan, int, int], Any] | None = None,
            ahead: int = 0) -> Iterator[tuple[BatchPlan, Any]]:
        """``(plan, work(plan))`` in plan order; an error in ``work`` is raised here, noting the plan's rows.
        ``warm(plan, k % ahead, ahead)`` (``k``: the plan's count in this run) is queued ``ahead`` plans before
        ``work(plan)``; what it raises is ignored (``work`` meets the same error where it can be reported).
        Closing the generator cancels the plans not started."""
        pool = self._pool or ThreadPoolExecutor(self.num_threads, thread_name_prefix=THREAD_PREFIX)
        pending: deque = deque()
        coming: deque = deque()  # plans taken from ``plans`` but not yet submitted
        to_warm: list = []  # (plan, part) taken but not yet warmed: warmed by the next task submitted
        taken = 0
        done = _Doorbell()
        try:
            while True:
                while len(pending) < self.depth:
                    while len(coming) <= (ahead if warm is not None else 0):
                        plan = next(plans, None)
                        if plan is None:
                            break
                        if warm is not None and ahead > 0:
                            to_warm.append((plan, taken % ahead))
                            taken += 1
                        coming.append(plan)
                    plan = coming.popleft() if coming else None
                    if plan is None:
                        break
                    future = pool.submit(_warm_then_work, warm, tuple(to_warm), ahead, work, plan)
                    to_warm.clear()
                    future.add_done_callback(done.ring)
                    pending.append((plan, future))
                if not pending:
                    return
                plan, future = pending.popleft()
                done.wait_for(future)
                try:
                    made = future.result()
                except BaseException as e:
                    if hasattr(e, "add_note"):
                        rows = plan.indices
                        e.add_note(f"raised in a feedline feature worker thread preparing a batch of {rows.size} "
                                   f"rows (first {rows[:4].tolist()})")
                    raise
                yield plan, made
        finally:
            for _, future in pending:
                future.cancel()
            if pool is not self._pool:
                pool.shutdown(wait=may_join(), cancel_futures=True)
            elif may_join():  # kept threads: the work already running ends with the stream
                wait([future for _, future in pending])
            done.close()

    def keep(self) -> None:
        """Keep the threads from one ``run`` to the next, until ``close``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=THREAD_PREFIX)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=may_join(), cancel_futures=True)
            self._pool = None


def _warm_then_work(warm, warming: tuple, parts: int, work: Callable[[BatchPlan], Any], plan: BatchPlan) -> Any:
    """``warm(each, part, parts)`` of ``warming`` (what a warming raises is ignored: the plan's own work meets the
    same error where it can be reported), then ``work(plan)``."""
    for ahead, part in warming:
        try:
            warm(ahead, part, parts)
        except Exception:
            pass
    return work(plan)
