"""Which samples each rank sees, in which order and in which batches, epoch by epoch.

``Order`` is what the Loader, placement and the runners ask of an order, and what every order shares: its
arguments checked once, each rank's share of an epoch (``per_rank``), the batches that cut it (``spans``).
Two orders: ``EpochSampler``, an exact permutation of every sample, and ``stream_order.StreamOrder``, a
streamed table's chunks through a shuffle buffer. An order is a pure function of (seed, epoch): every rank
computes the same epoch and takes its own share of it, and a restored position resumes exactly. Any rank's share
can be read from any rank (``for_rank``, ``positions``), so the rest of an epoch that ranks of one job left can
be dealt to the ranks of another (``remainder.ResumedOrder``).
"""
from __future__ import annotations

import copy
import enum
import threading
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..pipelines.choices import parse_enum
from ..pipelines.validate import flag, int_at_least, int_in, positive_int

STATE_VERSION = 3  # 2: partial shards are equal across ranks (one padding repeat where needed); 3: "resizes"
READ_VERSIONS = (2, 3)  # a version-2 state is a version-3 one without resizes


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


@dataclass(frozen=True, init=False)
class BatchPlan:
    indices: np.ndarray  # int64 dataset indices, in delivery order
    valid: np.ndarray    # bool, False for padding
    epoch: int = 0       # keys per-sample augmentation randomness together with the index
    start: int = 0       # position of the first sample in this rank's order for the epoch
    last: bool = True    # the epoch's last batch on this rank
    batch: int = 0       # the batch's number in its epoch on this rank
    shard: int | None = None  # samples in the epoch on this rank (None: a plan on its own)

    def __init__(self, indices: np.ndarray, valid: np.ndarray, epoch: int = 0, start: int = 0, last: bool = True,
                 batch: int = 0, shard: int | None = None):
        # The dataclass's own __init__ of a frozen class sets each field through object.__setattr__: seven calls
        # a plan, on the batch thread. Written into the instance's dict instead (what those calls do).
        fields = self.__dict__
        fields["indices"], fields["valid"], fields["epoch"], fields["start"] = indices, valid, epoch, start
        fields["last"], fields["batch"], fields["shard"] = last, batch, shard


class Order:
    """An epoch's batches for one rank. What the rest of the loader reads: ``num_samples``, ``batch_size``,
    ``shuffle``, ``seed``, ``rank``, ``world_size``, ``last_batch``, ``len()`` (batches per epoch on this rank),
    ``shard_size(epoch)`` (samples, padding included, per epoch on this rank: the same on every rank) and
    ``epoch(...)`` (the plans). What a resume on another number of ranks reads (``remainder``): ``positions``
    (any stretch of this rank's share, without the plans before it), ``make_plan`` (a plan of such stretches) and
    ``for_rank`` (the same order seen from another rank of a job of any size)."""

    unit = "samples"  # what the order counts, in its errors
    # Whether ``on_error="skip"`` can leave a rank's position ahead of its batches times ``batch_size`` (its
    # runner fills a batch past a skipped sample from later ones): then ranks of one job stop at different positions.
    skips_move_positions = True

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
        return self.per_rank_of(self.num_samples)

    def per_rank_of(self, num_samples: int) -> int:
        """``per_rank`` for a dataset of ``num_samples`` (it never falls as ``num_samples`` grows)."""
        if self.last_batch is LastBatch.DROP:
            return (num_samples // self.world_size) // self.batch_size * self.batch_size
        samples = -(-num_samples // self.world_size)
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
        shard = self.shard_size(epoch)
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

    def positions(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """Per-sample columns of this rank's positions ``[start, stop)`` in ``epoch``: dataset indices and
        validity, then any an order's plans carry besides (``make_plan`` takes them back). By default read from
        its plans; an order that can reach a position directly overrides this."""
        parts = [(p.indices, p.valid) for p in self.epoch(epoch, start_sample=start) if p.start < stop]
        indices = np.concatenate([i for i, _ in parts] or [np.empty(0, np.int64)])[:stop - start]
        return indices, np.concatenate([v for _, v in parts] or [np.empty(0, bool)])[:stop - start]

    def make_plan(self, columns: tuple[np.ndarray, ...], epoch: int, start: int, last: bool, batch: int,
                  shard: int) -> BatchPlan:
        """The plan of samples whose ``positions`` columns are ``columns``."""
        return BatchPlan(columns[0], columns[1], epoch, start, last, batch, shard)

    def for_rank(self, rank: int, world_size: int) -> "Order":
        """The same order (dataset, seed, batch size, policy) as rank ``rank`` of a job of ``world_size`` sees
        it: a shallow copy, sharing what this one holds (an order that keeps something for its rank alone
        overrides this to drop it)."""
        other = copy.copy(self)
        other.world_size = positive_int("world_size", world_size)
        other.rank = int_in("rank", rank, 0, other.world_size - 1)
        return other


class EpochSampler(Order):
    """An exact seeded permutation of ``num_samples`` samples per epoch; a rank takes every
    ``world_size``-th of it."""

    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, last_batch: LastBatch | str = LastBatch.PARTIAL):
        self._arguments(num_samples, batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                        last_batch=last_batch)
        # The last epoch's permutation, shared by the copies ``for_rank`` makes (it is the same on every rank).
        self._permutation = _LastPermutation()

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        return self._permutation.get(epoch, lambda: np.random.Generator(
            np.random.Philox(key=self.seed, counter=[0, 0, 0, epoch])).permutation(self.num_samples).astype(np.int64))

    def positions(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Position ``p`` of rank ``r`` is place ``p * world_size + r`` of the epoch's permutation; places past
        its end repeat it from its start, as padding (with DROP a rank holds only whole batches of real places)."""
        if not 0 <= start <= stop <= self.per_rank:
            raise ValueError(f"epoch {epoch} has {self.per_rank} {self.unit} on this rank; cannot read [{start}, "
                             f"{stop})")
        places = np.arange(start, stop, dtype=np.int64) * self.world_size + self.rank
        return self._order(epoch)[places % self.num_samples], places < self.num_samples

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> list[BatchPlan]:
        number, spans = self.spans(epoch, start_batch, start_sample=start_sample, first_batch=first_batch)
        shard, valid = self.positions(epoch, 0, self.per_rank)
        return [BatchPlan(shard[a:b], valid[a:b], epoch, a, b == shard.size, number + k, shard.size)
                for k, (a, b) in enumerate(spans)]


class _LastPermutation:
    """One epoch's permutation, kept until another epoch's is asked for (by any thread)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kept: tuple[int, np.ndarray] | None = None

    def get(self, epoch: int, make) -> np.ndarray:
        with self._lock:
            if self._kept is None or self._kept[0] != epoch:
                self._kept = (epoch, make())
            return self._kept[1]


def parse_last_batch(value: LastBatch | str) -> LastBatch:
    return parse_enum(LastBatch, "last_batch", value)
