"""Loads by key, each run by one thread at a time: the first thread to claim a key loads it, the others wait for
that load and get its result or its error. Shared by the caches of sources (chunks, prepared rows), which
keep what was loaded under the same lock that claims keys.
"""
from __future__ import annotations

import threading
from typing import Callable, Hashable


class Flight:
    """One load under way. ``ended``: a lock held from the claim until the load has ended, which each waiter takes
    and gives back (a threading.Event would build a Condition at every load and run ~6 Python calls to set it)."""

    __slots__ = ("ended", "value", "error")

    def __init__(self):
        self.ended = threading.Lock()
        self.ended.acquire()
        self.value: object = None
        self.error: BaseException | None = None

    def wait(self) -> object:
        """The load's result once it has finished; its error raised here too."""
        with self.ended:
            pass
        if self.error is not None:
            raise self.error
        return self.value


class SingleFlight(dict):
    """The loads under way by key, claimed and finished under ``lock`` (the owner's, which guards its cache too).
    A dict of their ``Flight``s, so that ``key in flights`` (holding the lock: is ``key`` being loaded now?), asked
    for every chunk a plan warms, is the dict's own test, in C."""

    def __init__(self, lock: threading.Lock):
        super().__init__()
        self._lock = lock

    def claim(self, key: Hashable) -> tuple[Flight, bool]:
        """(Holding the lock.) The load of ``key`` under way, and whether it is the caller's (a new one: the caller
        must ``run`` it) rather than another thread's (to ``wait`` for)."""
        flight = self.get(key)
        if flight is not None:
            return flight, False
        flight = self[key] = Flight()
        return flight, True

    def run(self, key: Hashable, flight: Flight, load: Callable[[], object], *,
            keep: Callable[[object], None] | None = None, share_error: bool = True) -> object:
        """(Not holding the lock.) ``load()`` for the claimed ``flight`` of ``key``; its result returned, or its
        error raised, and either handed to those waiting. Once it has returned, ``keep(result)`` runs under the
        lock, with the flight ended, before any waiter wakes. ``share_error=False``: a failure is the caller's
        alone: those waiting find no error and no result (and look again)."""
        try:
            flight.value = load()
        except BaseException as exc:
            if share_error:
                flight.error = exc
            raise
        finally:
            with self._lock:
                del self[key]
                if keep is not None and flight.value is not None:
                    keep(flight.value)
            flight.ended.release()
        return flight.value
