"""Worker threads that make batch plans' host parts ahead of the thread that delivers them.

Up to ``depth`` plans are in flight: each thread finds its next plan queued when it finishes one, so it need
not be woken (a wake-up is a system call made holding the GIL, and costly on virtual machines); the batch
thread is woken only for the plan it waits for (``_Doorbell``).

A caller may also ask for plans to be warmed ``ahead`` plans before they are made (``warm``): each plan, as it
is taken from the iterator, is warmed (what it will need read into a cache) by the task of the next plan made,
before that plan, so that work a plan would do in one burst (the chunks of a new shuffle buffer-full) is spread
over the plans before it; the run's first ``ahead`` tasks warm after their plan instead (their plans read the
buffer-full that no task warmed before them: the first batch waited for the first task's warming of the next
buffer-full, the second for the second's). One task a plan, not two; and a task is a small object on a C queue
(``_Pool``), not a ``concurrent.futures`` future, whose making, queueing and finishing take some fifty Python
calls holding the GIL.
"""
from __future__ import annotations

import functools
import queue
import threading
from collections import deque
from typing import Any, Callable, Iterator

from ..sampler import BatchPlan
from ..exit_joins import join_at_exit
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
    """How a worker tells the batch thread that the task it waits for is done: a ring of the pipe, and only
    while it waits for that very task (``wait_for``), so that tasks finished ahead of time wake nobody (a
    ``Future``'s ``result()`` would wake it holding the GIL, once per batch)."""

    def __init__(self):
        super().__init__()
        self._watched = None

    def finished(self, task: _Task) -> None:
        if task is self._watched:
            self.ring()

    def wait_for(self, task: _Task) -> None:
        """Until ``task`` is done (a worker finishing it rings once it is watched; a ring may be spurious)."""
        self._watched = task  # set before looking: a worker finishing now then sees it and rings
        while not task.done:
            self.wait()
        self._watched = None


class _Task:
    """``call(*args)``, whose result (or error) the batch thread takes once ``done``; then ``after()`` (the warming of
    later plans: what it raises is ignored, the plan's own work meets the same error where it can be reported)."""

    __slots__ = ("call", "args", "after", "bell", "done", "cancelled", "result", "error")

    def __init__(self, call: Callable, args: tuple, bell: _Doorbell, after: Callable[[], Any] | None = None):
        self.call, self.args, self.after, self.bell = call, args, after, bell
        self.done = self.cancelled = False
        self.result = self.error = None

    def run(self) -> Callable[[], Any] | None:
        """The call, then done; returns what to run after it (None when cancelled)."""
        if not self.cancelled:
            try:
                self.result = self.call(*self.args)
            except BaseException as e:  # handed to the thread that takes the result
                self.error = e
        self.done = True
        self.bell.finished(self)
        return None if self.cancelled else self.after


class _Pool:
    """``num_threads`` daemon threads running the tasks put on one queue, in order, until ``shutdown``."""

    def __init__(self, num_threads: int):
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{THREAD_PREFIX}_{k}", daemon=True)
                         for k in range(num_threads)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            after = task.run()
            del task  # (its result is the batch: held here on, the ring could not reuse it before the next task)
            if after is not None:
                after()

    def submit(self, task: _Task) -> _Task:
        self._tasks.put(task)
        return task

    def shutdown(self, wait: bool) -> None:
        for _ in self._threads:
            self._tasks.put(None)
        join_at_exit(self._threads)  # (each ends after its task in hand)
        if wait:
            for thread in self._threads:
                thread.join()


class PlanThreads:
    """``num_threads`` worker threads running ``work(plan)`` for up to ``depth`` plans ahead."""

    def __init__(self, num_threads: int, depth: int):
        self.num_threads = num_threads
        self.depth = depth
        self._pool: _Pool | None = None

    def run(self, plans: Iterator[BatchPlan], work: Callable[[BatchPlan], Any], *,
            warm: Callable[[BatchPlan, int, int], Any] | None = None,
            ahead: int = 0) -> Iterator[tuple[BatchPlan, Any]]:
        """``(plan, work(plan))`` in plan order; an error in ``work`` is raised here, noting the plan's rows.
        ``warm(plan, k % ahead, ahead)`` (``k``: the plan's count in this run) is queued ``ahead`` plans before
        ``work(plan)`` (the first task warms the first ``ahead + 1`` plans; the first ``ahead`` tasks warm after
        their work); what it raises is ignored (``work`` meets the same error where it can be reported). Closing
        the generator cancels the plans not started."""
        pool = self._pool or _Pool(self.num_threads)
        pending: deque = deque()
        coming: deque = deque()  # plans taken from ``plans`` but not yet submitted
        to_warm: list = []  # (plan, part) taken but not yet warmed: warmed by the next task submitted
        taken = submitted = 0
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
                    warming = tuple(to_warm)
                    if not warming:
                        task = pool.submit(_Task(work, (plan,), done))
                    elif submitted < ahead:  # (no task warmed this plan's buffer-full: made first)
                        after = functools.partial(_warm_all, warm, warming, ahead)
                        task = pool.submit(_Task(work, (plan,), done, after))
                    else:
                        task = pool.submit(_Task(_warm_then_work, (warm, warming, ahead, work, plan), done))
                    submitted += 1
                    to_warm.clear()
                    pending.append((plan, task))
                if not pending:
                    return
                plan, task = pending.popleft()
                done.wait_for(task)
                made, e = task.result, task.error
                task = None
                if e is not None:
                    if hasattr(e, "add_note"):
                        rows = plan.indices
                        e.add_note(f"raised in a feedline feature worker thread preparing a batch of {rows.size} "
                                   f"rows (first {rows[:4].tolist()})")
                    raise e
                yield plan, made
        finally:
            for _, task in pending:
                task.cancelled = True
            if pool is not self._pool:
                pool.shutdown(wait=may_join())
            elif may_join():  # kept threads: the work already running ends with the stream
                for _, task in pending:
                    done.wait_for(task)
            done.close()

    def keep(self) -> None:
        """Keep the threads from one ``run`` to the next, until ``close``."""
        if self._pool is None:
            self._pool = _Pool(self.num_threads)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=may_join())
            self._pool = None


def _warm_all(warm, warming: tuple, parts: int) -> None:
    """``warm(each, part, parts)`` of ``warming`` (what a warming raises is ignored: the plan's own work meets the
    same error where it can be reported)."""
    for ahead, part in warming:
        try:
            warm(ahead, part, parts)
        except Exception:
            pass


def _warm_then_work(warm, warming: tuple, parts: int, work: Callable[[BatchPlan], Any], plan: BatchPlan) -> Any:
    """``_warm_all``, then ``work(plan)``."""
    _warm_all(warm, warming, parts)
    return work(plan)
