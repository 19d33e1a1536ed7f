"""The local side's groups of a ``RemoteRunner``'s deal (a table's groups of shuffle buffer-fulls), made on a thread of
their own as soon as they are dealt, one group after another, and timed there as a worker's are.

The runner runs over the plans of the groups queued, one group after another, and stops when none is queued
(the thread never waits for plans inside the runner, which could hold batches already made); the next group
starts a new run. Batches are handed over one by one as they are made; an error met making one is raised where
that batch is taken, after the batches before it (and where any later batch of the run is).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..sampler import BatchPlan
from .contract import Runner

_THREAD_NAME = "feedline-remote-local"


@dataclass(eq=False)
class LocalJob:
    """A group of plans kept locally: its batches as they are made, and the error that stopped it, if any."""

    plans: tuple[BatchPlan, ...]
    results: list = field(default_factory=list)
    error: BaseException | None = None
    finished: bool = False


class LocalMaker:
    """Makes ``LocalJob``s in the order they are added, with ``runner``; ``timed(batches, seconds)`` is told how
    long each whole group took."""

    def __init__(self, runner: Runner, timed: Callable[[int, float], None]):
        self.runner = runner
        self.timed = timed
        self._queue: deque[LocalJob] = deque()
        self._changed = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    def add(self, plans: list[BatchPlan]) -> LocalJob:
        job = LocalJob(tuple(plans))
        with self._changed:
            self._queue.append(job)
            self._changed.notify_all()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=_THREAD_NAME, daemon=True)
            self._thread.start()
        return job

    def take(self, job: LocalJob, k: int):
        """``(batch, info)`` of the job's ``k``-th plan, once made (the error that stopped the job instead)."""
        with self._changed:
            while len(job.results) <= k and job.error is None and not job.finished and not self._closing:
                self._changed.wait()
            if len(job.results) <= k:
                if job.error is not None:
                    raise job.error
                if job.finished:
                    raise RuntimeError(f"the local runner made {len(job.results)} batches of {len(job.plans)} plans")
                raise RuntimeError("the local maker was closed")  # closed from another thread while waiting
            taken, job.results[k] = job.results[k], None  # the trainer's tensors alone hold the batch from now on
            return taken

    def _next(self) -> LocalJob | None:
        with self._changed:
            while not self._queue and not self._closing:
                self._changed.wait()
            return None if self._closing else self._queue.popleft()

    def _run(self) -> None:
        while (first := self._next()) is not None:
            fed: deque[LocalJob] = deque()  # the job of each plan handed to the runner, in order

            def feed(job: LocalJob = first):
                """The plans of ``job`` and of the jobs queued after it, until none is queued: one run of the
                runner (and its threads) lasts as long as there is work, never waiting for plans inside it."""
                while True:
                    for plan in job.plans:
                        fed.append(job)
                        yield plan
                    with self._changed:
                        if self._closing or not self._queue:
                            return
                        job = self._queue.popleft()

            started = time.perf_counter()
            stream = self.runner.batches(feed())
            try:
                for made in stream:
                    job = fed.popleft()
                    with self._changed:
                        job.results.append(made)
                        job.finished = len(job.results) == len(job.plans)
                        self._changed.notify_all()
                        if self._closing:
                            break
                    if job.finished:  # timed from the end of the group before it in this run, or the run's start
                        now = time.perf_counter()
                        self.timed(len(job.plans), now - started)
                        started = now
            except BaseException as e:  # handed to whoever takes the batch it stopped at, and the jobs after it
                with self._changed:
                    for job in dict.fromkeys([*fed, *self._queue]):
                        job.error, job.finished = e, True
                    self._queue.clear()
                    self._changed.notify_all()
            finally:
                stream.close()

    def close(self) -> None:
        """Stop after the batch being made (the runner's own work in flight is stopped by closing its run)."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
