"""Which samples each rank sees, in which order and in which batches, epoch by epoch.

One pure object shared by every pipeline: the order is a function of (seed, epoch) alone, so every rank
computes the same permutation and takes its own stride of it, and a restored state resumes exactly.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from ..pipelines.choices import parse_enum

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


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class EpochSampler:
    def __init__(self, num_samples: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, last_batch: LastBatch | str = LastBatch.PARTIAL):
        self.num_samples = _positive_int("num_samples", num_samples)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.world_size = _positive_int("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an integer in [0, world_size={self.world_size}), got {rank!r}")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be True or False, got {shuffle!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.rank = int(rank)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.last_batch = parse_last_batch(last_batch)
        if self.last_batch is LastBatch.DROP and len(self) == 0:
            raise ValueError(f"last_batch='drop' with batch_size={batch_size} and {self.world_size} rank(s) "
                             f"leaves no batch from {num_samples} samples")

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.Generator(np.random.Philox(key=self.seed, counter=[0, 0, 0, epoch]))
        return rng.permutation(self.num_samples).astype(np.int64)

    def _shard(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        order = self._order(epoch)
        valid = np.ones(order.size, dtype=bool)
        if self.last_batch is not LastBatch.DROP:
            per_rank = -(-self.num_samples // self.world_size)
            if self.last_batch is LastBatch.PAD:
                per_rank = -(-per_rank // self.batch_size) * self.batch_size
            total = per_rank * self.world_size
            extra = total - order.size
            order = np.concatenate([order, np.resize(order, extra)])
            valid = np.concatenate([valid, np.zeros(extra, dtype=bool)])
        shard = order[self.rank::self.world_size]
        shard_valid = valid[self.rank::self.world_size]
        if self.last_batch is LastBatch.DROP:
            keep = (self.num_samples // self.world_size) // self.batch_size * self.batch_size
            shard, shard_valid = shard[:keep], shard_valid[:keep]
        return shard, shard_valid

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        if self.last_batch is LastBatch.DROP:
            return (self.num_samples // self.world_size) // self.batch_size
        return -(-(-(-self.num_samples // self.world_size)) // self.batch_size)

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> list[BatchPlan]:
        """The epoch's batches from batch ``start_batch``, or from sample position ``start_sample`` (then the
        first plan runs from there to the next batch boundary, and is batch ``first_batch`` of the epoch: a
        runner that filled batches past skipped samples has delivered fewer samples than its batches hold)."""
        shard, valid = self._shard(epoch)
        start = start_batch * self.batch_size if start_sample is None else start_sample
        if not 0 <= start <= shard.size:
            raise ValueError(f"epoch {epoch} has {shard.size} samples on this rank; cannot start at {start}")
        number = start // self.batch_size if first_batch is None else first_batch
        bounds = [start] + list(range((start // self.batch_size + 1) * self.batch_size, shard.size, self.batch_size))
        bounds = [b for b in bounds if b < shard.size] + [shard.size]
        return [BatchPlan(shard[a:b], valid[a:b], epoch, a, b == shard.size, number + k, shard.size)
                for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]

    def shard_size(self, epoch: int) -> int:
        return self._shard(epoch)[0].size


def parse_last_batch(value: LastBatch | str) -> LastBatch:
    return parse_enum(LastBatch, "last_batch", value)
