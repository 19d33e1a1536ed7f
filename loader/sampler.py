"""Which samples each rank sees, in which order and in which batches, epoch by epoch.

``Order`` is what the Loader, placement and the runners ask of an order, and what every order shares: its
arguments checked once, each rank's share of an epoch (``per_rank``), the batches that cut it (``spans``).
Two orders: ``EpochSampler``, an exact permutation of every sample, and ``stream_order.StreamOrder``, a
streamed table's chunks through a shuffle buffer. An order is a pure function of (seed, epoch): every rank
computes the same epoch and takes its own share of it, and a restored position resumes exactly.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..pipelines.choices import parse_enum
from ..pipelines.validate import flag, int_at_least, int_in, positive_int

STATE_VERSION = 2  # 2: partial shards are equal across ranks (one padding repeat where needed)


class LastBatch(enum.Enum):
    """What happens to the samples that do not fill a last whole batch.

    DROP: they are not delivered this epoch (every rank yields the same number of full batches).
    PARTIAL: the last batch of a rank is smaller. With several ranks every rank gets ``ceil(N / world_size)``
    samples, a rank with one fewer getting one repeat marked invalid, so every rank yields the same number of
    batches (a DDP job steps in lockstep) and the valid samples over all ranks are the dataset exactly once.
    PAD: the shard and its last batch are filled up with repeats of earlier samples, which the batch's
    ``valid`` mask marks False, so every rank yields the same number of full batches and the valid samples
    over all ranks are the dataset exactly once.
    """

    DROP = "drop"
    PARTIAL = "partial"
    PAD = "pad"


@dataclass(frozen=True)
class BatchPlan:
    indices: np.ndarray  # int64 dataset indices, in delivery order
    valid: np.ndarray    # bool, False for padding
    epoch: int = 0       # keys per-sample augmentation randomness together with the index
    start: int = 0       # position of the first sample in this rank's order for the epoch
    last: bool = True    # the epoch's last batch on this rank
    batch: int = 0       # the batch's number in its epoch on this rank
    shard: int | None = None  # samples in the epoch on this rank (None: a plan on its own)


class Order:
    """An epoch's batches for one rank. What the rest of the loader reads: ``num_samples``, ``batch_size``,
    ``shuffle``, ``seed``, ``rank``, ``world_size``, ``last_batch``, ``len()`` (batches per epoch on this rank),
    ``shard_size(epoch)`` (samples, padding included, per epoch on this rank) and ``epoch(...)`` (the plans)."""

    unit = "samples"  # what the order counts, in its errors

    def _arguments(self, num_samples: int, batch_size: int, *, shuffle: bool, seed: int, rank: int,
                   world_size: int, last_batch: LastBatch | str, num_samples_name: str = "num_samples") -> None:
        """Check and keep the arguments every order takes."""
        self.num_samples = positive_int(num_samples_name, num_samples)
        self.batch_size = positive_int("batch_size", batch_size)
        self.world_size = positive_int("world_size", world_size)
        self.rank = int_in("rank", rank, 0, self.world_size - 1)
        self.shuffle = flag("shuffle", shuffle)
        self.seed = int_at_least("seed", seed, 0)
        self.last_batch = parse_last_batch(last_batch)
        if self.last_batch is LastBatch.DROP and len(self) == 0:
            raise ValueError(f"last_batch='drop' with batch_size={batch_size} and {self.world_size} rank(s) "
                             f"leaves no batch from {self.num_samples} {self.unit}")

    @property
    def per_rank(self) -> int:
        """Samples (padding included) each rank delivers per epoch: with ``DROP`` its whole batches, else
        ``ceil(N / world_size)``, with ``PAD`` filled up to whole batches."""
        if self.last_batch is LastBatch.DROP:
            return (self.num_samples // self.world_size) // self.batch_size * self.batch_size
        samples = -(-self.num_samples // self.world_size)
        if self.last_batch is LastBatch.PAD:
            samples = -(-samples // self.batch_size) * self.batch_size
        return samples

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return -(-self.per_rank // self.batch_size)

    def shard_size(self, epoch: int) -> int:
        return self.per_rank

    def spans(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> tuple[int, list[tuple[int, int]]]:
        """The epoch's batches from batch ``start_batch``, or from sample position ``start_sample`` (then the
        first runs from there to the next batch boundary, and is batch ``first_batch`` of the epoch: a runner
        that filled batches past skipped samples has delivered fewer samples than its batches hold): the first
        one's number, and each one's ``[start, stop)`` in this rank's order."""
        shard = self.per_rank
        start = start_batch * self.batch_size if start_sample is None else start_sample
        if not 0 <= start <= shard:
            raise ValueError(f"epoch {epoch} has {shard} {self.unit} on this rank; cannot start at {start}")
        number = start // self.batch_size if first_batch is None else first_batch
        bounds = [start] + list(range((start // self.batch_size + 1) * self.batch_size, shard, self.batch_size))
        bounds = [b for b in bounds if b < shard] + [shard]
        return number, list(zip(bounds, bounds[1:]))

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> Iterable[BatchPlan]:
        """The epoch's plans, as ``spans`` cuts them."""
        raise NotImplementedError


class EpochSampler(Order):
    """An exact seeded permutation of ``num_samples`` samples per epoch; a rank takes every
    ``world_size``-th of it."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, last_batch: LastBatch | str = LastBatch.PARTIAL):
        self._arguments(num_samples, batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                        last_batch=last_batch)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.Generator(np.random.Philox(key=self.seed, counter=[0, 0, 0, epoch]))
        return rng.permutation(self.num_samples).astype(np.int64)

    def _shard(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        order = self._order(epoch)
        valid = np.ones(order.size, dtype=bool)
        if self.last_batch is not LastBatch.DROP:
            extra = self.per_rank * self.world_size - order.size
            order = np.concatenate([order, np.resize(order, extra)])
            valid = np.concatenate([valid, np.zeros(extra, dtype=bool)])
        keep = self.per_rank  # (with DROP, the rank's whole batches)
        return order[self.rank::self.world_size][:keep], valid[self.rank::self.world_size][:keep]

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> list[BatchPlan]:
        number, spans = self.spans(epoch, start_batch, start_sample=start_sample, first_batch=first_batch)
        shard, valid = self._shard(epoch)
        return [BatchPlan(shard[a:b], valid[a:b], epoch, a, b == shard.size, number + k, shard.size)
                for k, (a, b) in enumerate(spans)]


def parse_last_batch(value: LastBatch | str) -> LastBatch:
    return parse_enum(LastBatch, "last_batch", value)
