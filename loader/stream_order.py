"""Which rows of a streamed table each rank reads, in which order and in which batches, epoch by epoch.

The table is a sequence of chunks (byte ranges of a text file, pieces of a gzip file or a Parquet row group,
blocks of a converted table), grouped where a group must be read front to back (a gzip file, a row group).
An epoch's order is two seeded shuffles, both pure functions of (seed, epoch):

1. The groups are permuted; their chunks keep their order, and their rows, laid end to end, form the epoch's
   row sequence.
2. Each rank takes one contiguous range of that sequence (``ceil(N / world_size)`` rows; see ``LastBatch``)
   and delivers it through a shuffle buffer of ``buffer_rows``: the rank's rows are taken a buffer-full at a
   time and each buffer-full is delivered in a seeded random order.

A buffer-full shuffle rather than a sliding one, so that the row at any position of any epoch is known
without replaying the epoch: resuming mid-epoch is exact and costs nothing, and only one or two buffer-fulls
of rows are ever held. ``shuffle=False`` gives the files' order. A row's index is its global position: rows
numbered over the files in order.
"""
from __future__ import annotations

import threading
from typing import Iterator

import numpy as np

from ..ops.sequence_rows import seeded_permutation, sequence_rows
from ..pipelines.validate import positive_int
from .sampler import BatchPlan, LastBatch, Order

DEFAULT_BUFFER_ROWS = 1 << 16
KEPT_WINDOWS = 2  # windows whose rows are kept made: a batch may straddle two


class StreamOrder(Order):
    """An ``Order`` over a streamed table's chunks. ``chunk_rows``: rows per chunk, in file order;
    ``chunk_groups``: each chunk's group (non-decreasing)."""

    unit = "rows"
    skips_move_positions = False  # a bad row's slot is padding in its own batch (the feature runner)

    def __init__(self, chunk_rows, chunk_groups, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 rank: int = 0, world_size: int = 1, last_batch: LastBatch | str = LastBatch.PARTIAL,
                 buffer_rows: int = DEFAULT_BUFFER_ROWS, table=None):
        """``table``: the table the chunks are of; while its index is still being built (``table.pending``: a
        gzip file opened lazily, ``chunk_rows`` then its chunks so far), see "An index still being built"."""
        self._lazy = None
        self._lazy_lock = threading.Lock()
        self._epoch_order: tuple = (None, None, None)  # the last epoch's chunk order and its rows' starts
        self._last_window: tuple = (None, None)
        self._kept_windows: list = []  # ((epoch, window), rows, valid), the latest first
        self.buffer_rows = positive_int("shuffle_buffer", buffer_rows)
        if table is not None and table.pending and world_size == 1 and len(set(np.asarray(chunk_groups).tolist())) <= 1:
            try:  # (the arguments checked against the rows indexed so far; a check they fail waits for all)
                self._arguments(int(table.num_rows), batch_size, shuffle=shuffle, seed=seed, rank=rank,
                                world_size=world_size, last_batch=last_batch, num_samples_name="rows")
                self._lazy = table
            except ValueError:
                table.wait_rows(1 << 62)
        if self._lazy is None:
            if table is not None and table.pending:
                table.wait_rows(1 << 62)
            if table is not None:
                chunk_rows, chunk_groups = table.chunk_rows, table.chunk_groups
            self._set_chunks(chunk_rows, chunk_groups)
            self._arguments(int(self.chunk_rows.sum()), batch_size, shuffle=shuffle, seed=seed, rank=rank,
                            world_size=world_size, last_batch=last_batch, num_samples_name="rows")

    def _set_chunks(self, chunk_rows, chunk_groups) -> None:
        self.chunk_rows = np.asarray(chunk_rows, dtype=np.int64)
        self.chunk_groups = np.asarray(chunk_groups, dtype=np.int64)
        self.first_row = np.concatenate([[0], np.cumsum(self.chunk_rows)[:-1]]).astype(np.int64)
        starts = np.flatnonzero(np.diff(self.chunk_groups, prepend=-1) != 0)
        self._group_chunks = np.split(np.arange(self.chunk_rows.size), starts[1:])

    # ---- an index still being built ----------------------------------------------------------------
    # A single gzip file opened lazily is one group: its chunks in file order whatever the seed, so the
    # epoch's row sequence is the file's rows and window w holds rows [w*B, (w+1)*B) in the window's seeded
    # order (one rank: its share starts at row 0). That needs no row count until the last window: a window
    # whose end the index already covers (N >= (w+1)*B, after DROP's rounding) is full, and a batch ending
    # before the rows indexed is not the epoch's last. So batches are made as soon as the index covers them,
    # and are the very batches of the complete index; once the index is complete the order is the plain one.
    # What needs the row count (``num_samples``, ``per_rank``, ``positions``, ``for_rank``, a saved state)
    # waits for the index; ``len()`` is an estimate until then.

    @property
    def num_samples(self) -> int:
        if self._lazy is not None:
            self._finish(wait=True)
        return self._num_samples

    @num_samples.setter
    def num_samples(self, value: int) -> None:
        self._num_samples = value

    def _finish(self, *, wait: bool) -> bool:
        """The row count taken from the table once its index is complete (waiting for it with ``wait``);
        whether the order is complete now."""
        table = self._lazy
        if table is None:
            return True
        if table.pending:
            if not wait:
                return False
            table.wait_rows(1 << 62)  # (holding no lock: the batch thread goes on with the rows indexed meanwhile)
        with self._lazy_lock:
            if self._lazy is None:
                return True
            self._set_chunks(table.chunk_rows, table.chunk_groups)
            self._num_samples = int(self.chunk_rows.sum())  # (before the order reads as complete)
            self._lazy = None
            self._arguments(int(self.chunk_rows.sum()), self.batch_size, shuffle=self.shuffle, seed=self.seed,
                            rank=self.rank, world_size=self.world_size, last_batch=self.last_batch,
                            num_samples_name="rows")
            return True

    def __len__(self) -> int:
        """Batches this rank yields per epoch: while the table's index is being built, an estimate (from the
        table's estimate of its rows), exact once it is complete."""
        if self._lazy is not None and not self._finish(wait=False):
            table = self._lazy
            if table is not None:
                return -(-self.per_rank_of(max(table.estimate_rows(), table.num_rows)) // self.batch_size)
        return super().__len__()

    def _lazy_epoch(self, epoch: int, start: int, number: int) -> Iterator[BatchPlan]:
        """The epoch's plans from position ``start`` (batch ``number``), each made once the index covers it."""
        size, buffer = self.batch_size, self.buffer_rows
        a = start
        while True:
            table = self._lazy
            if table is None or self._finish(wait=False):
                yield from self.epoch(epoch, start_sample=a, first_batch=number)
                return
            b = (a // size + 1) * size
            # Full windows up to the one holding position b - 1, and a position past b: not the last batch.
            target = max(-(-b // buffer) * buffer, b + 1)
            need = -(-target // size) * size if self.last_batch is LastBatch.DROP else target
            known, complete = table.wait_rows(need)
            if complete or self.per_rank_of(known) < target:
                continue
            yield BatchPlan(self._lazy_rows(epoch, a, b), np.ones(b - a, dtype=bool), epoch, a, False, number, None)
            a, number = b, number + 1

    def _lazy_rows(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Rows of positions ``[start, stop)`` of full windows (one group, one rank: position p of window w is
        row w * B + the window's order at p - w * B)."""
        buffer = self.buffer_rows
        out = np.empty(stop - start, dtype=np.int64)
        p = start
        while p < stop:
            w_start = p // buffer * buffer
            take = min(stop, w_start + buffer) - p
            perm = self._window(epoch, p // buffer, buffer)
            out[p - start:p - start + take] = perm[p - w_start:p - w_start + take] + w_start
            p += take
        return out

    def for_rank(self, rank: int, world_size: int) -> "StreamOrder":
        """The chunk order and its rows' starts are every rank's; the shuffled windows are this rank's."""
        self._finish(wait=True)
        other = super().for_rank(rank, world_size)
        other._last_window, other._kept_windows = (None, None), []
        return other

    # ---- the order --------------------------------------------------------------------------------
    def _chunk_order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.chunk_rows.size)
        groups = seeded_permutation(self.seed, (0, 0, 1, epoch), len(self._group_chunks))
        return np.concatenate([self._group_chunks[g] for g in groups])

    def _sequence(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's chunk order and where each of its chunks starts in the row sequence (kept for reuse)."""
        cached_epoch, order, starts = self._epoch_order
        if cached_epoch != epoch:
            order = self._chunk_order(epoch)
            starts = np.concatenate([[0], np.cumsum(self.chunk_rows[order])[:-1]]).astype(np.int64)
            self._epoch_order = (epoch, order, starts)
        return order, starts

    def _window(self, epoch: int, window: int, size: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(size)
        key, perm = self._last_window
        if key != (epoch, window):
            # (NumPy's Philox permutation, made without the GIL: on the batch thread, once per window)
            perm = seeded_permutation(self.seed, (self.rank, window, 2, epoch), size)
            self._last_window = ((epoch, window), perm)
        return perm

    def _window_rows(self, epoch: int, window: int, size: int, per_rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Global rows and validity of every position of a window (a buffer-full), made in one pass and kept for
        the batches that follow (the last ``KEPT_WINDOWS``; ``_positions`` looks there first)."""
        order, seq_start = self._sequence(epoch)
        base = self.rank * per_rank
        rows = np.empty(size, dtype=np.int64)
        valid = np.empty(size, dtype=bool)
        # Position base + w_start + perm[...] in the epoch's row sequence; padding repeats rows, marked invalid.
        sequence_rows(self._window(epoch, window, size), base + window * self.buffer_rows, self.num_samples,
                      seq_start, self.first_row[order], rows, valid)
        self._kept_windows = [((epoch, window), rows, valid)] + self._kept_windows[:KEPT_WINDOWS - 1]
        return rows, valid

    def positions(self, epoch: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Global rows and validity of the rank's delivery positions ``[start, stop)`` in ``epoch``."""
        return self._positions(epoch, start, stop, self.per_rank)

    def _positions(self, epoch: int, start: int, stop: int, per_rank: int) -> tuple[np.ndarray, np.ndarray]:
        """``positions``, with the rank's share ``per_rank`` given (``epoch`` reads it once an epoch: a property
        of two Python calls). A window already made is found here, with no call (most batches)."""
        out = np.empty(stop - start, dtype=np.int64)
        valid = np.empty(stop - start, dtype=bool)
        buffer = self.buffer_rows
        p = start
        while p < stop:
            window = p // buffer
            w_start = window * buffer
            size = min(buffer, per_rank - w_start)
            take = min(stop, w_start + size) - p
            key = (epoch, window)
            for kept, rows, ok in self._kept_windows:  # (one read of the list: it is replaced whole)
                if kept == key:
                    break
            else:
                rows, ok = self._window_rows(epoch, window, size, per_rank)
            out[p - start:p - start + take] = rows[p - w_start:p - w_start + take]
            valid[p - start:p - start + take] = ok[p - w_start:p - w_start + take]
            p += take
        return out, valid

    def epoch(self, epoch: int, start_batch: int = 0, *, start_sample: int | None = None,
              first_batch: int | None = None) -> Iterator[BatchPlan]:
        """The epoch's plans, made lazily (memory does not grow with the rows)."""
        if self._lazy is not None and not self._finish(wait=False):
            start = start_batch * self.batch_size if start_sample is None else start_sample
            yield from self._lazy_epoch(epoch, start, start // self.batch_size if first_batch is None else first_batch)
            return
        number, spans = self.spans(epoch, start_batch, start_sample=start_sample, first_batch=first_batch)
        shard = self.per_rank
        for k, (a, b) in enumerate(spans):
            rows, valid = self._positions(epoch, a, b, shard)
            yield BatchPlan(rows, valid, epoch, a, b == shard, number + k, shard)
