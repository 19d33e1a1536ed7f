"""Making batches off the trainer's thread: a runner's stream runs on a thread of its own, ``depth`` batches
ahead, and the trainer's ``next()`` only takes a finished one.

GPU work of the stream (DALI's GPU stages, CuPy, torch on CUDA, the host-to-device copy) is issued on a CUDA
stream this thread owns. Each finished batch carries an event recorded on that stream; the trainer's current
stream waits on the event (no device-wide synchronisation), and every CUDA tensor of the batch is marked as
used on the trainer's stream (``record_stream``) so that the caching allocator does not hand its memory out
again while the trainer still reads it.

An error on the thread reaches the trainer's ``next()`` as itself, with a note saying where it happened; a
thread that died without a word is reported instead of waited on forever. Closing the stream (or dropping
it, or the interpreter exiting) stops the thread and joins it. In a child made by ``fork()`` the thread does
not exist and the queue's locks may be held by it: there the stream refuses batches and closing it touches
nothing.
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import warnings
import weakref
from collections import deque
from typing import Any, Callable, Iterator

import torch

from . import latency
from .exit_joins import join_all, join_at_exit
from .wake_pipe import WakePipe

THREAD_NAME = "feedline-batches"
_POLL_S = 0.1
_MIN_LOOK_S = 0.0002  # the giver's shortest wait before looking at a full queue again
_FIRST_LOOK_S = 0.001
_JOIN_S = 30.0
_live: "weakref.WeakSet[BackgroundStream]" = weakref.WeakSet()

_ITEM, _END, _ERROR = "item", "end", "error"


class _Handoff:
    """A bounded first-in first-out hand-off from one producing thread to one consuming thread. Appending and
    taking are atomic deque operations; a side waits on a pipe only when it must (nothing to take, no room),
    after saying so. The giver rings the taker only while it waits: batches handed over ahead of time wake
    nobody. A ring may be spurious (a step already seen), never missed: each side looks again after saying it
    waits, and a pipe stays readable until it is read.

    The taker (the trainer's thread) rings the giver only when it takes the last item: the giver looks at a full
    queue again after a quarter of the time between its last two appends the last time it had to wait for room
    (a trainer's step, when the trainer sets the pace), so that the trainer's ``next()`` makes no system call.
    A ring from the trainer's thread (a pipe write waking a thread, the GIL let go around it and taken back)
    cost it ~0.15 ms of its own CPU in every ``next()`` on 2 busy cores, and more waiting for a core."""

    def __init__(self, depth: int):
        self.depth = depth
        self._items: deque = deque()
        self._filled = WakePipe()  # closed once garbage: neither thread can use it then
        self._emptied = WakePipe()
        self._taker_waits = False
        self._giver_waits = False
        self._appended_at = 0.0  # (time.monotonic) the giver's last append
        self._look_s = _FIRST_LOOK_S  # how long the giver waits before looking at a full queue again

    def put(self, item, stopped: threading.Event) -> bool:
        """Append ``item`` once there is room; False (nothing appended) once ``stopped`` is set."""
        waited = False
        while len(self._items) >= self.depth:
            if stopped.is_set():
                return False
            waited = True
            self._giver_waits = True
            if len(self._items) >= self.depth:
                self._emptied.wait(self._look_s)
            self._giver_waits = False
        if stopped.is_set():
            return False
        self._items.append(item)
        now = time.monotonic()
        if waited:  # room came when the taker took: the time since the last append is the taker's pace
            self._look_s = min(max((now - self._appended_at) / 4, _MIN_LOOK_S), _POLL_S)
        self._appended_at = now
        if self._taker_waits:
            self._filled.ring()
        return True

    def get(self, timeout: float):
        """The oldest item; ``queue.Empty`` when none came within ``timeout`` seconds."""
        if not self._items:
            self._taker_waits = True
            if not self._items:
                self._filled.wait(timeout)
            self._taker_waits = False
            if not self._items:
                raise queue.Empty
        item = self._items.popleft()
        if self._giver_waits and not self._items:  # (else the giver looks again on its own, soon)
            self._emptied.ring()
        return item

    def get_nowait(self):
        try:
            item = self._items.popleft()
        except IndexError:
            raise queue.Empty from None
        self._emptied.ring()
        return item

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items


class BackgroundStream:
    """``make()`` is called on the new thread and returns the iterator to run there (so that everything it
    builds lazily, such as a DALI pipeline, is built there). ``cuda``: the device whose work is put on the
    stream's own CUDA stream, or None."""

    def __init__(self, make: Callable[[], Iterator], depth: int, *, cuda: torch.device | None = None,
                 describe: Callable[[], str] = lambda: "making a batch"):
        self._queue = _Handoff(depth)
        self._stop = threading.Event()
        self._cuda_stream = torch.cuda.Stream(cuda) if cuda is not None else None
        self._describe = describe
        self._done = False
        self._pid = os.getpid()
        self._taker: int | None = None  # the native id of the thread taking the batches, with a short slice
        self._thread = threading.Thread(target=self._run, args=(make,), name=THREAD_NAME, daemon=True)
        _live.add(self)
        _last_at_exit()
        self._thread.start()
        join_at_exit([self._thread])  # (at exit, once every open stream is closed: it ends on its own then)

    # ---- the stream's thread ------------------------------------------------------------------
    def _run(self, make: Callable[[], Iterator]) -> None:
        try:
            if self._cuda_stream is not None:
                torch.cuda.set_stream(self._cuda_stream)
            items = make()
            put, stop, cuda_stream = self._queue.put, self._stop, self._cuda_stream  # (looked up once, not per batch)
            try:
                for item in items:
                    event = None
                    if cuda_stream is not None:
                        event = torch.cuda.Event()
                        event.record(cuda_stream)
                    if not put((_ITEM, item, event), stop):
                        return
            finally:
                items.close()
            self._put((_END, None, None))
        except BaseException as exc:  # handed to the trainer's thread, which raises it there
            if hasattr(exc, "add_note"):
                exc.add_note(f"raised in feedline's batch thread ({THREAD_NAME}) while {self._describe()}")
            self._put((_ERROR, exc, None))

    def _put(self, message: tuple) -> bool:
        """Queue ``message`` unless the stream is being closed; False when it is."""
        return self._queue.put(message, self._stop)

    # ---- the trainer's thread -----------------------------------------------------------------
    def __iter__(self) -> BackgroundStream:
        return self

    def __next__(self) -> Any:
        if self._done:  # (also set in a forked child, by a fork hook: no system call per batch)
            if os.getpid() != self._pid:
                raise RuntimeError(f"feedline's batch thread runs in process {self._pid}; this process "
                                   f"({os.getpid()}) was forked from it and cannot take its batches")
            raise StopIteration
        if self._taker is None:
            self._shorten_taker()
        while True:
            try:
                kind, payload, event = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError(f"feedline's batch thread ({THREAD_NAME}) ended without delivering a batch or "
                                       f"an error") from None
        if kind == _ERROR:
            self._done = True
            raise payload
        if kind == _END:
            self._done = True
            raise StopIteration
        if event is not None:
            _hand_over(payload, event)
        return payload

    def _shorten_taker(self) -> None:
        """The thread taking the batches (the trainer's) wakes from its step onto a core a loader thread holds:
        ask for a short slice so that it gets the core at once (see :mod:`.latency`); put back at ``close``."""
        tid = threading.get_native_id()
        self._taker = tid if latency.shorten(tid) else 0

    @property
    def ready(self) -> int:
        """Finished batches waiting to be taken."""
        return self._queue.qsize()

    def close(self, wait: bool = True) -> None:
        """Stop the thread (what it made but nobody took is dropped) and, with ``wait``, join it. A finaliser
        must not wait: the garbage collector may run it on a thread the stream's thread is itself waiting for
        (a worker of the runner's pool), and the two would wait on each other."""
        self._stop.set()
        self._done = True
        if os.getpid() != self._pid:
            return  # a forked child: the thread is the parent's
        taker, self._taker = self._taker, 0
        if taker:
            latency.restore(taker)
        if not wait:
            try:
                while True:
                    self._queue.get_nowait()  # unblock a put at once; the thread then ends on its own
            except queue.Empty:
                return
        started = time.monotonic()
        while self._thread.is_alive():
            try:
                while True:
                    self._queue.get_nowait()  # a thread blocked on a full queue sees the stop at its next try
            except queue.Empty:
                pass
            if threading.current_thread() is self._thread:
                return  # closed from its own thread (a finaliser run there): it ends when this call returns
            self._thread.join(timeout=_POLL_S)
            if time.monotonic() - started > _JOIN_S:
                warnings.warn(f"feedline: the batch thread did not stop within {_JOIN_S:.0f} s ({self._describe()}); "
                              f"leaving it", RuntimeWarning, stacklevel=2)
                break
        _live.discard(self)

    def __del__(self):
        try:
            self.close(wait=False)
        except Exception:
            pass


def _hand_over(batch: Any, event: torch.cuda.Event) -> None:
    """Make ``batch`` safe on the calling thread's current CUDA stream."""
    stream = torch.cuda.current_stream()
    stream.wait_event(event)
    for tensor in _tensors(batch):
        if tensor.is_cuda:
            tensor.record_stream(stream)


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _close_all() -> None:
    """No batch thread outlives the interpreter's last Python code: each is stopped and joined at exit, and so is
    every thread still ending (a dropped stream's, a pool's), see :mod:`.exit_joins`."""
    for stream in list(_live):
        stream.close()
    left = join_all(_JOIN_S)
    if left:
        warnings.warn(f"feedline: {len(left)} thread(s) did not end within {_JOIN_S:.0f} s at exit "
                      f"({', '.join(t.name for t in left)}); the interpreter may abort as it finalises",
                      RuntimeWarning, stacklevel=2)


def _done_in_child() -> None:
    """In a child made by ``fork()`` no stream's thread exists: each is done (and ``__next__`` says why)."""
    for stream in list(_live):
        stream._done = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_done_in_child)


def _last_at_exit() -> None:
    """(Re)register ``_close_all`` so that it runs before every exit hook registered so far: the threads must
    stop before DALI's own hook shuts its pipelines down under them."""
    atexit.unregister(_close_all)
    atexit.register(_close_all)
