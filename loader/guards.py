"""Uses of a Loader it cannot serve, refused with an error that says what to do instead: an iterator that a
newer ``iter(loader)`` replaced, and a Loader copied into a child process by ``fork()`` after it started."""
from __future__ import annotations

import os
import weakref


class StaleIteratorError(RuntimeError):
    """An iterator of a Loader used after a newer iteration of the same Loader started."""


class ForkedLoaderError(RuntimeError):
    """A Loader used in a process forked from the one whose threads and pipelines it runs on."""


class Iterations:
    """One active iterator per Loader: starting an iteration (the first ``next`` of a new ``iter(loader)``)
    takes the Loader over, and an older iterator raises when it is used again (``check``; a batch asks
    ``if token is not iterations.active`` first, without a call)."""

    def __init__(self):
        self.active: object | None = None

    def start(self) -> object:
        self.active = token = object()
        return token

    def check(self, token: object, epoch: int) -> None:
        if token is not self.active:
            raise StaleIteratorError(
                f"this iterator of the Loader (epoch {epoch}) was replaced: a newer iter(loader) started since, "
                f"and a Loader runs one iteration at a time (its position, its batch thread and its state are "
                f"shared). Use the newest iterator, or build a second Loader to read the data twice at once.")


class ProcessGuard:
    """The process a Loader's batch thread and pipelines live in, from its first iteration on. Threads do not
    survive ``fork()``: a forked child sees the Loader's prefetched batches but nothing that makes more.

    ``copied`` is set in a forked child by a fork hook, so that a batch asks an attribute (``if guard.copied:
    guard.check()``), not the system (``os.getpid()``: a system call per batch on the trainer's thread)."""

    def __init__(self):
        self.pid: int | None = None
        self.copied = False

    def started(self) -> None:
        if self.pid is None:
            self.pid = os.getpid()
            _started.add(self)

    @property
    def forked(self) -> bool:
        return self.copied or (self.pid is not None and self.pid != os.getpid())

    def check(self) -> None:
        if self.forked:
            raise ForkedLoaderError(
                f"this Loader started iterating in process {self.pid} and was copied into process {os.getpid()} "
                f"by fork(); its batch thread and pipelines exist only in process {self.pid}. Build the Loader in "
                f"the process that iterates it (e.g. in the worker, after the fork); to continue where the parent "
                f"stood, pass the parent's loader.state_dict() to the new Loader's load_state_dict().")


_started: "weakref.WeakSet[ProcessGuard]" = weakref.WeakSet()


def _mark_copied() -> None:
    for guard in list(_started):
        guard.copied = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_mark_copied)
