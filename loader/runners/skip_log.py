"""The samples a runner left out under ``on_error="skip"``: each once, in the order met, and logged."""
from __future__ import annotations

import logging

from ..errors import DataError, Skipped

log = logging.getLogger("feedline")


class SkipLog:
    def __init__(self):
        self.skipped: list[Skipped] = []  # the first skip of each sample, in the order met
        self._indices: set[int] = set()

    def add(self, error: DataError, index: int, epoch: int) -> None:
        """Records sample ``index`` as left out for ``error``, unless it was already."""
        if index not in self._indices:
            self._indices.add(index)
            self.skipped.append(Skipped(error.where, error.reason, index, epoch))
            log.warning("feedline: skipped %s: %s", error.where, error.reason)

    def first(self) -> Skipped:
        return self.skipped[0]
