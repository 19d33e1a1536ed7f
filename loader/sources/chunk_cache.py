"""The chunks of a streamed table kept in memory: each read once however many threads ask for it at the same
time, the least lately used dropped past ``limit_rows`` rows, and the buffers of dropped chunks read into
again once nothing refers to them.
"""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict, deque
from functools import partial
from typing import Callable, NamedTuple

import numpy as np

from ... import ops
from ...ops.gather_columns import BIT_FLAGS, block_addresses
from .single_flight import SingleFlight

SPARE_BUFFERS = 4  # evicted chunks' buffers kept for reading the next chunks into


class PackedChunk(NamedTuple):
    """A cached chunk: its scalar columns as one block (integer columns, then float columns, each in declared
    order), its list columns, and its bad rows."""

    block: ops.ColumnBlock
    lists: dict          # name -> ListColumn
    bad: np.ndarray
    reasons: dict
    any_bad: bool


class ChunkCache:
    """Chunks by number, ``chunk_rows[c]`` rows each, read by the ``load(c)`` each call is given (which caches
    nothing; given per call, so that the cache holds no reference back to its table). ``reads_into``: the
    chunks are buffers read into (``load`` takes them from ``spare``), not a parser's arrays."""

    def __init__(self, chunk_rows: np.ndarray, limit_rows: int, *, reads_into: bool):
        self._chunk_rows = chunk_rows
        self.limit_rows = limit_rows
        self._reads_into = reads_into
        self._cache: OrderedDict[int, PackedChunk] = OrderedDict()
        self._retired: list[np.ndarray] = []  # buffers of evicted chunks, read into again once nobody holds them
        self._cached_rows = 0
        self._lock = threading.Lock()
        self._loading = SingleFlight(self._lock)
        # Where the cached chunks that are buffers of row records with bit flags (a converted table's, a text
        # table's kept by its table cache) and no bad rows lie, by chunk number (``addressed``): their (data,
        # flags) addresses, 0 where a chunk is not cached or not such a block, and their layouts (kept: a chunk's
        # layout is the same at every read; a table cache's differ from chunk to chunk, as ``gather_table`` takes).
        self._addresses = np.zeros((chunk_rows.size, 2), np.int64)
        self._layouts: np.ndarray | None = None
        self._addressed = 0  # chunks with an address
        self._bit_flags = ((), b"")  # the shape and flag kinds of the last layout found all BIT_FLAGS
        # What ``addressed`` gives, made once after each change of the cached chunks (under the lock, dropped by the
        # change): a batch then builds no list of the chunks and copies no addresses (most batches change nothing).
        self._snapshot: tuple[tuple, np.ndarray, np.ndarray] | None = None

    def grow(self, chunk_rows: np.ndarray, limit_rows: int) -> None:
        """The table has more chunks (an index built while read): ``chunk_rows`` extends the one given before."""
        with self._lock:
            self._chunk_rows, self.limit_rows = chunk_rows, limit_rows
            self._snapshot = None
            if self._addresses is not None and chunk_rows.size > self._addresses.shape[0]:
                grown = np.zeros((chunk_rows.size, 2), np.int64)
                grown[:self._addresses.shape[0]] = self._addresses
                self._addresses = grown
                self._layouts = None if self._layouts is None else _grown(self._layouts, chunk_rows.size)

    def addressed(self) -> tuple[tuple, np.ndarray, np.ndarray] | None:
        """What ``ops.gather_table`` reads the cached chunks by: (every cached chunk, which the caller holds
        while the kernel reads them; a copy of their addresses by chunk number, 0 for any other; their layouts
        by number), taken together; None where no cached chunk has an address. The same objects until the cached
        chunks change (never written: a change makes new ones), so most batches take them with no lock and no copy;
        one taken just before a change holds the chunks it names, so their buffers are not read into meanwhile."""
        snapshot = self._snapshot  # (one read: another thread may drop it at any time)
        if snapshot is not None:
            return snapshot
        with self._lock:
            if not self._addressed:
                return None
            snapshot = self._snapshot = (tuple(self._cache.values()), self._addresses.copy(), self._layouts)
            return snapshot

    def touch(self, chunks: list[int]) -> None:
        """The cached ones of ``chunks`` (in order) made the most lately used, as a chunk read is."""
        with self._lock:
            try:  # (all cached, as they mostly are: one pass in C, no Python step per chunk)
                deque(map(self._cache.move_to_end, chunks), 0)
            except KeyError:  # one was dropped since: the same order, the dropped ones skipped
                cache = self._cache
                for c in chunks:
                    if c in cache:
                        cache.move_to_end(c)

    def _address(self, c: int, block) -> None:
        """(Holding the lock.) Chunk ``c``'s block noted by address, where its layout is like the others'."""
        if not isinstance(block, ops.ColumnBlock):
            return
        layout = block.layout
        if layout.shape != self._bit_flags[0] or layout[:, 3].tobytes() != self._bit_flags[1]:
            if layout.ndim != 2 or layout.shape[1] != 6 or not layout.shape[0] or (layout[:, 3] != BIT_FLAGS).any():
                return  # (row-major blocks with byte flags, as version-1 tables' chunks: found by grouping)
            self._bit_flags = (layout.shape, layout[:, 3].tobytes())
        if self._layouts is None:
            self._layouts = np.zeros((self._addresses.shape[0], *layout.shape), np.int64)
        elif layout.shape != self._layouts.shape[1:]:
            return
        where = block_addresses(block)
        if where is None:  # (no native kernel)
            return
        self._layouts[c] = layout
        if not self._addresses[c, 0]:
            self._addressed += 1
        self._addresses[c] = where

    def load_missing(self, chunks: list[int], load: Callable[[int], PackedChunk]) -> None:
        """Read, one at a time, the chunks of ``chunks`` that nobody has yet or is reading: threads reading the
        same chunks (plans of one shuffle buffer-full) then share the parsing instead of waiting for each
        other's."""
        with self._lock:  # (mostly all are held: one look)
            if all(map(self._cache.__contains__, chunks)):
                return
        for c in chunks:
            with self._lock:
                if c in self._cache or c in self._loading:
                    continue
            self.get(c, load)

    def get(self, c: int, load: Callable[[int], PackedChunk]) -> PackedChunk:
        """Chunk ``c``, from the cache, or read (once, by the first thread asking) and cached."""
        with self._lock:
            chunk = self._cache.get(c)
            if chunk is not None:
                self._cache.move_to_end(c)
                return chunk
            loading, mine = self._loading.claim(c)
        if not mine:
            return loading.wait()
        return self._loading.run(c, loading, partial(load, c), keep=partial(self._keep, c))  # (no Python frames)

    def get_all(self, chunks: list[int], load: Callable[[int], PackedChunk]) -> list[PackedChunk]:
        """``get`` of each of ``chunks``, in order: one look under the lock when all are cached (as they mostly
        are: ``load_missing`` read them first), which makes none of them more lately used (a table's warming
        does: see ``ChunkedTable.warm``). Holding what it returns keeps a chunk's buffer from being read into
        again even if the chunk is evicted meanwhile."""
        with self._lock:
            got = [self._cache.get(c) for c in chunks]
        for k, chunk in enumerate(got):
            if chunk is None:
                got[k] = self.get(chunks[k], load)
        return got

    def _keep(self, c: int, chunk: PackedChunk) -> None:
        """(Holding the lock.) Chunk ``c`` cached, the least lately used dropped past ``limit_rows`` rows."""
        self._snapshot = None  # (before anything changes: nothing reads the chunks and addresses of this change)
        self._cache[c] = chunk
        self._cached_rows += int(self._chunk_rows[c])
        if not chunk.any_bad:  # (a bad row is noted by the grouped gather)
            self._address(c, chunk.block)
        while self._cached_rows > self.limit_rows and len(self._cache) > 1:
            old, dropped = self._cache.popitem(last=False)
            self._cached_rows -= int(self._chunk_rows[old])
            if self._addresses is not None and self._addresses[old, 0]:
                self._addresses[old] = 0
                self._addressed -= 1
            if self._reads_into:
                self._retire(dropped.block.data)

    def __iter__(self):
        """The numbers of the chunks cached now, the least lately used first."""
        with self._lock:
            return iter(list(self._cache))

    def cached(self, c: int) -> PackedChunk | None:
        with self._lock:
            return self._cache.get(c)

    def release(self, chunk: PackedChunk) -> None:
        """A chunk read outside the cache that nothing reads any more: its buffer is read into again."""
        if self._reads_into and chunk.block.data.base is None:  # a buffer read into
            with self._lock:
                self._retire(chunk.block.data)

    def _retire(self, buffer: np.ndarray) -> None:
        self._retired.append(buffer)
        del self._retired[:-SPARE_BUFFERS]

    def spare(self, nbytes: int) -> np.ndarray | None:
        """A retired buffer of ``nbytes`` that nothing refers to any more (a gather still running on its chunk
        holds it), taken out of the list; else None."""
        with self._lock:
            for k in range(len(self._retired)):  # no loop variable: it would hold one more reference
                # References when free: the list's and getrefcount's argument.
                if self._retired[k].nbytes == nbytes and sys.getrefcount(self._retired[k]) <= 2:
                    return self._retired.pop(k)
        return None


def _grown(layouts: np.ndarray, chunks: int) -> np.ndarray:
    grown = np.zeros((chunks, *layouts.shape[1:]), np.int64)
    grown[:layouts.shape[0]] = layouts
    return grown
