"""Where a Loader stands in its epochs, and its saved form."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping

from .runners.contract import BatchInfo


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass
class Cursor:
    """``epoch``; ``batches`` delivered in it; ``sample``: the next position in this rank's order for the
    epoch (after a resume on another number of ranks, in this rank's share of the epoch's rest); ``complete``: its last batch was delivered. ``pinned``: ``set_epoch`` or a loaded state chose where
    the next iteration starts, so starting it must not move on to the next epoch.

    Every update and every read of several fields holds ``lock``, so that another thread (one that saves the
    state while the trainer iterates) never sees an update half done."""

    epoch: int = 0
    batches: int = 0
    sample: int = 0
    complete: bool = False
    pinned: bool = False
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def begin(self) -> None:
        """An iteration starts: after a started or finished epoch it is the next epoch (as with a DataLoader)."""
        with self.lock:
            if not self.pinned and (self.batches > 0 or self.complete):
                self.go_to(self.epoch + 1)
            self.pinned = False

    def go_to(self, epoch: int, *, pinned: bool = False) -> None:
        with self.lock:
            self.epoch, self.batches, self.sample, self.complete, self.pinned = epoch, 0, 0, False, pinned

    def advance(self, info: BatchInfo, delivered: bool) -> tuple[int, int]:
        """Past the batch ``info`` says; returns ``next_sample`` after it (one call per batch, not two)."""
        with self.lock:
            self.sample, self.complete = info.end, info.last
            self.batches += delivered
            return (self.epoch + 1, 0) if info.last else (self.epoch, info.end)

    @property
    def next_sample(self) -> tuple[int, int]:
        """(epoch, position) of the next sample to be made."""
        with self.lock:
            return (self.epoch + 1, 0) if self.complete else (self.epoch, self.sample)

    def state(self) -> dict[str, Any]:
        with self.lock:
            return {"epoch": self.epoch, "position": self.batches, "cursor": self.sample, "complete": self.complete}

    def load(self, state: Mapping[str, Any], shard_size) -> None:
        """Resume at the state's next batch; ``shard_size(epoch)`` bounds the saved position."""
        epoch, position, sample, complete = (state.get(k) for k in ("epoch", "position", "cursor", "complete"))
        if not (_count(epoch) and _count(position) and _count(sample)) or not isinstance(complete, bool) \
                or sample > shard_size(epoch):
            raise ValueError(f"state has an invalid position: epoch={epoch!r}, position={position!r}, "
                             f"cursor={sample!r}, complete={complete!r}")
        with self.lock:
            if complete:
                self.go_to(epoch + 1, pinned=True)
            else:
                self.epoch, self.batches, self.sample, self.complete, self.pinned = epoch, position, sample, False, True
