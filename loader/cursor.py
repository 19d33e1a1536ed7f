"""Where a Loader stands in its epochs, and its saved form."""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from .runners.contract import BatchInfo


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Place(NamedTuple):
    """A ``Cursor``'s fields, read by name in C (no Python call)."""
    epoch: int
    batches: int
    sample: int
    complete: bool
    pinned: bool


_place = tuple.__new__  # ``_place(Place, fields)``: a Place made in C (``Place(...)`` runs a Python ``__new__``)


class Cursor:
    """``epoch``; ``batches`` delivered in it; ``sample``: the next position in this rank's order for the
    epoch (after a resume on another number of ranks, in this rank's share of the epoch's rest); ``complete``: its
    last batch was delivered. ``pinned``: ``set_epoch`` or a loaded state chose where the next iteration starts, so
    starting it must not move on to the next epoch.

    The fields are one ``Place`` (``place``), replaced whole by every update, so that another thread (one that saves
    the state while the trainer iterates) reads an update whole or not at all, with no lock taken per batch."""

    def __init__(self):
        self.place = _place(Place, (0, 0, 0, False, False))

    epoch = property(lambda self: self.place.epoch)
    batches = property(lambda self: self.place.batches)
    sample = property(lambda self: self.place.sample)
    complete = property(lambda self: self.place.complete)

    @property
    def pinned(self) -> bool:
        return self.place.pinned

    @pinned.setter
    def pinned(self, pinned: bool) -> None:
        self.place = self.place._replace(pinned=pinned)

    def begin(self) -> None:
        """An iteration starts: after a started or finished epoch it is the next epoch (as with a DataLoader)."""
        place = self.place
        if not place.pinned and (place.batches > 0 or place.complete):
            self.go_to(place.epoch + 1)
        else:
            self.place = place._replace(pinned=False)

    def go_to(self, epoch: int, *, pinned: bool = False) -> None:
        self.place = _place(Place, (epoch, 0, 0, False, pinned))

    def advance(self, info: BatchInfo, delivered: bool) -> tuple[int, int]:
        """Past the batch ``info`` says; returns ``next_sample`` after it."""
        epoch, batches, _, _, pinned = self.place
        self.place = _place(Place, (epoch, batches + delivered, info.end, info.last, pinned))
        return (epoch + 1, 0) if info.last else (epoch, info.end)

    @property
    def next_sample(self) -> tuple[int, int]:
        """(epoch, position) of the next sample to be made."""
        place = self.place
        return (place.epoch + 1, 0) if place.complete else (place.epoch, place.sample)

    def state(self) -> dict[str, Any]:
        place = self.place
        return {"epoch": place.epoch, "position": place.batches, "cursor": place.sample, "complete": place.complete}

    def load(self, state: Mapping[str, Any], shard_size) -> None:
        """Resume at the state's next batch; ``shard_size(epoch)`` bounds the saved position."""
        epoch, position, sample, complete = (state.get(k) for k in ("epoch", "position", "cursor", "complete"))
        if not (_count(epoch) and _count(position) and _count(sample)) or not isinstance(complete, bool) \
                or sample > shard_size(epoch):
            raise ValueError(f"state has an invalid position: epoch={epoch!r}, position={position!r}, "
                             f"cursor={sample!r}, complete={complete!r}")
        if complete:
            self.go_to(epoch + 1, pinned=True)
        else:
            self.place = _place(Place, (epoch, position, sample, False, True))
