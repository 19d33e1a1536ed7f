"""The rest of an epoch that the ranks of one job left, dealt to the ranks of a job of another size.

When the ``W`` ranks of a job stop in epoch ``e`` at positions ``k_0 .. k_{W-1}`` of their shares, what is left of
the epoch is, old rank after old rank, the positions ``[k_r, shard)`` of each share: a sequence of ``R`` samples,
read lazily through the old order (never the whole dataset's indices). The new job's ranks take contiguous
ranges of it, as a streamed table's ranks take ranges of its rows (so a rank reads few chunks), sized by the
``last_batch`` policy as an epoch is: ``DROP`` whole batches, ``PARTIAL`` ``ceil(R / W')`` (the last rank's tail
padding), ``PAD`` that filled up to whole batches. Padding repeats samples of the rest, marked invalid; the old
order's padding stays invalid. So the valid samples of the epoch, before the stop and after it, are the dataset
exactly once (with ``DROP``: at most once), every new rank makes the same number of batches, and each sample keeps
its augmentation (keyed by seed, epoch and index). A job resized again mid-epoch chains: the earlier job's order is
itself a ``ResumedOrder``. The epochs after ``e`` are the new job's own.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .sampler import BatchPlan, LastBatch, Order


def share_size(remaining: int, world_size: int, batch_size: int, last_batch: LastBatch) -> int:
    """Positions of the rest each new rank delivers, padding included (``Order.per_rank`` for ``remaining``)."""
    if last_batch is LastBatch.DROP:
        return remaining // world_size // batch_size * batch_size
    share = -(-remaining // world_size)
    return -(-share // batch_size) * batch_size if last_batch is LastBatch.PAD else share


class ResumedOrder(Order):
    """``base``'s epochs (this rank's order in the new job), except epoch ``at``: the rest of it after the ranks
    of the earlier job, whose order ``before`` is (seen from any of its ranks), stopped at ``stops`` (rank by
    rank, the next position of its share)."""

    def __init__(self, base: Order, before: Order, at: int, stops: Sequence[int]):
        self.base, self.before, self.at = base, before, at
        for name in ("num_samples", "batch_size", "shuffle", "seed", "rank", "world_size", "last_batch", "unit",
                     "skips_move_positions"):
            setattr(self, name, getattr(base, name))
        shard = before.shard_size(at)
        if len(stops) != before.world_size or any(not 0 <= k <= shard for k in stops):
            raise ValueError(f"the positions of the {before.world_size} rank(s) that stopped in epoch {at} must be "
                             f"{before.world_size} numbers from 0 to {shard}, got {list(stops)}")
        self.stops = tuple(int(k) for k in stops)
        left = np.array([shard - k for k in self.stops], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(left)]).astype(np.int64)  # of each old rank's rest
        self.remaining = int(self._starts[-1])
        self._earlier: dict[int, Order] = {}  # old rank -> its order, made when first read

    @property
    def share(self) -> int:
        """Positions of the rest this rank delivers (padding included)."""
        return share_size(self.remaining, self.world_size, self.batch_size, self.last_batch)

    per_rank = property(lambda self: self.base.per_rank)

    def shard_size(self, epoch: int) -> int:
        return self.share if epoch == self.at else self.base.shard_size(epoch)

    def resizes(self, epoch: int) -> list:
        """The jobs that ran epoch ``epoch`` before this one, each as ``[world_size, stops]``, oldest first."""
        if epoch != self.at:
            return []
        earlier = self.before.resizes(epoch) if isinstance(self.before, ResumedOrder) else []
        return earlier + [[self.before.world_size, list(self.stops)]]

    def for_rank(self, rank: int, world_size: int) -> "ResumedOrder":
        other = ResumedOrder.__new__(ResumedOrder)
        other.__dict__.update(self.__dict__)  # the earlier job's orders are every new rank's
        other.base = self.base.for_rank(rank, world_size)
        other.rank, other.world_size = other.base.rank, other.base.world_size
        return other

    def _old_rank(self, rank: int) -> Order:
        if rank not in self._earlier:
            self._earlier[rank] = self.before.for_rank(rank, self.before.world_size)
        return self._earlier[rank]

    def _rest(self, start: int, stop: int) -> Iterable[tuple[np.ndarray, ...]]:
        """The ``positions`` columns of places ``[start, stop)`` of the rest, old rank by old rank."""
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        for r in range(first, self.before.world_size):
            a, b = max(start, self._starts[r]), min(stop, self._starts[r + 1])
            if a >= stop:
                return
            if a < b:
                offset = self.stops[r] - int(self._starts[r])
                yield self._old_rank(r).positions(self.at, int(a) + offset, int(b) + offset)

    def positions(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, ...]:
        if epoch != self.at:
            return self.base.positions(epoch, start, stop)
        if not 0 <= start <= stop <= self.share:
            raise ValueError(f"the rest of epoch {epoch} has {self.share} {self.unit} on this rank; cannot read "
                             f"[{start}, {stop})")
        parts = []
        place, end = self.rank * self.share + start, self.rank * self.share + stop
        while place < end:  # places past the rest repeat it from its start, as padding
            lap, at = divmod(place, self.remaining)
            take = min(end - place, self.remaining - at)
            parts += [(c[0], c[1] & (lap == 0), *c[2:]) for c in self._rest(at, at + take)]
            place += take
        if not parts:
            return self._old_rank(0).positions(self.at, 0, 0)
        return tuple(np.concatenate(column) for column in zip(*parts))

    def make_plan(self, columns: tuple[np.ndarray, ...], epoch: int, start: int, last: bool, batch: int,
                  shard: int) -> BatchPlan:
        return self.base.make_plan(columns, epoch, start, last, batch, shard)

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> Iterable[BatchPlan]:
        if epoch != self.at:
            return self.base.epoch(epoch, start_batch, start_sample=start_sample, first_batch=first_batch)
        return self._plans(epoch, *self.spans(epoch, start_batch, start_sample=start_sample, first_batch=first_batch))

    def _plans(self, epoch: int, number: int, spans: list) -> Iterable[BatchPlan]:
        shard = self.share
        for k, (a, b) in enumerate(spans):
            yield self.make_plan(self.positions(epoch, a, b), epoch, a, b == shard, number + k, shard)


def plain(order: Order) -> Order:
    """The order of the new job's own epochs."""
    return order.base if isinstance(order, ResumedOrder) else order


def resizes(order: Order, epoch: int) -> list:
    return order.resizes(epoch) if isinstance(order, ResumedOrder) else []
