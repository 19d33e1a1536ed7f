"""The samples left out under ``on_error="skip"``: one log per Loader, written by everything that meets a bad
sample for it (its image runners, its table source, the results of its remote workers) and carried in its state,
so that replacing a runner or resuming keeps one list.

A sample is listed once, the first time it is met: by its dataset index where it has one (an image), else by
where it is (a table's ``file:line``, a whole file rejected when opened). Each newly listed sample is logged
(logger ``feedline``, WARNING), the first ``LOGGED`` of them one by one, then once that more are only listed."""
from __future__ import annotations

import logging
import threading
from typing import Iterable

from .errors import DataError, Skipped

log = logging.getLogger("feedline")

LOGGED = 20  # skips of one log that are logged one by one


def sample_of(skip: Skipped) -> int | str:
    """What identifies the skipped sample: its dataset index, else where it is."""
    return skip.where if skip.index is None else skip.index


class SkipLog:
    def __init__(self):
        self.skipped: list[Skipped] = []  # the first skip of each sample, in the order met (read it, never write it)
        self._samples: set[int | str] = set()
        self._lock = threading.Lock()  # plan threads of one runner meet bad rows at once
        self._logged = 0

    def __len__(self) -> int:
        return len(self.skipped)

    def add(self, skip: Skipped) -> bool:
        """Lists ``skip`` unless its sample is listed already; whether it was new."""
        sample = sample_of(skip)
        with self._lock:
            if sample in self._samples:
                return False
            self._samples.add(sample)
            self.skipped.append(skip)
            self._logged += 1
            logged = self._logged
        if logged <= LOGGED:
            log.warning("feedline: skipped %s: %s", skip.where, skip.reason)
            if logged == LOGGED:
                log.warning("feedline: %d samples skipped; further skips are listed (loader.skipped) but not "
                            "logged one by one", LOGGED)
        return True

    def add_error(self, error: DataError, index: int | None = None, epoch: int | None = None) -> bool:
        """Lists the sample ``error`` left out (``index`` and ``epoch``: where it was met, if it has an index)."""
        return self.add(Skipped(error.where, error.reason, index, epoch))

    def add_all(self, skips: Iterable[Skipped]) -> None:
        for skip in skips:
            self.add(skip)

    def first(self) -> Skipped:
        return self.skipped[0]

    def load(self, earlier: Iterable[Skipped]) -> None:
        """A resumed state's skips: they come first, then those listed here already that they do not hold (each
        sample once; the list is changed in place, so every writer keeps writing to it)."""
        with self._lock:
            merged: list[Skipped] = []
            samples: set[int | str] = set()
            for skip in [*earlier, *self.skipped]:
                sample = sample_of(skip)
                if sample not in samples:
                    samples.add(sample)
                    merged.append(skip)
            self.skipped[:] = merged
            self._samples = samples
