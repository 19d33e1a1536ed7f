"""A streamed table's rows in their finished form: the first time a batch needs a chunk, the chunk is read, run
through the pipeline's per-row stages (``prepare``: parse, normalise, hash) in order, and kept as a row block
(``ops.RowLayout``: a few 32-bit words a row), so that a batch only gathers finished rows, in one pass over
any number of chunks. Each row is still prepared once each time its chunk is read: once an epoch, or once in
all for a table that fits in the cache.

The blocks kept are bounded like the table's own cache (``cache_rows`` rows); the chunks a batch reads are
pinned while it reads them, so that no other thread drops them meanwhile. Each block keeps what its
preparation cost per stage, so that a profile charges every prepared row its share once: thread seconds where
a profile prepared it, wall seconds where batches did (reading a thread's CPU clock is a system call made
holding the GIL, and on a busy machine one in a hundred deschedules the thread for milliseconds with the GIL
held, stalling every other thread: the trainer's included).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, NamedTuple

import numpy as np

from ... import ops
from ...ops.row_blocks import least_recently_read, pin_chunks, unpin_read_chunks
from .single_flight import SingleFlight

SPARE_BLOCKS = 4  # dropped blocks kept for preparing the next chunks into


class PreparedGather(NamedTuple):
    """What ``PreparedRows.gather`` gives besides the arrays it wrote: which rows are bad, the stage seconds
    charged to these rows (when asked), and the thread seconds this call spent preparing chunks."""

    bad: np.ndarray
    charged: dict
    spent: float


class _Held(NamedTuple):
    bad: np.ndarray | None  # its bad rows (None: none)
    reasons: dict


_NO_BAD = _Held(None, {})  # every chunk without bad rows (never changed)


class _Scratch:
    def __init__(self, n: int, chunks: int):
        self.n = n
        self.chunk = np.empty(n, dtype=np.int64)
        self.local = np.empty(n, dtype=np.int64)
        self.touched = np.empty(max(min(n, chunks), 1), dtype=np.int64)
        self.counts = np.empty_like(self.touched)
        self.missing = np.empty_like(self.touched)  # the touched chunks not held, then those with bad rows


class PreparedRows:
    """``table``'s rows as ``prepare(raw_chunk, block, clock) -> {stage: seconds by clock}`` writes them into a
    block of ``layout`` (``raw_chunk``: the table's chunk as ``load_raw`` gives it). ``read_stage``: the stage
    that reading a chunk is charged to."""

    def __init__(self, table, layout: ops.RowLayout, prepare: Callable[[object, np.ndarray], dict],
                 *, read_stage: str):
        self.table = table
        self.layout = layout
        self.blocks = ops.RowBlocks(table.chunk_rows, layout)
        self._prepare = prepare
        self._read_stage = read_stage
        self.cache_rows = table.cache_rows
        chunks = table.chunk_rows.size
        self._lock = threading.Lock()
        self._pins = np.zeros(chunks, dtype=np.int64)
        self._stamps = np.zeros(chunks, dtype=np.int64)  # when each chunk was last read: the oldest goes first
        self._read = np.zeros(chunks, dtype=bool)  # whether a batch has read the chunk since it was prepared
        self._kept = np.zeros(chunks, dtype=bool)  # whether a chunk's block is held (``_held``), for whole batches
        self._bad = np.zeros(chunks, dtype=bool)  # whether a held chunk has bad rows
        self._since = np.zeros(chunks, dtype=np.int64)  # when each held chunk was taken in (ties drop in that order)
        self._taken = 0
        self._dropping = np.empty(chunks, dtype=np.int64)  # ``_evict``'s choice
        self._clock = 0
        self._held: dict[int, _Held] = {}
        self._held_rows = 0
        self._loading = SingleFlight(self._lock)
        self._spare: list[tuple[np.ndarray, int]] = []  # (buffer, its address)
        self._local = threading.local()
        self._stages: list[str] = [read_stage]
        self._seconds = np.zeros((chunks, 1), dtype=np.float64)  # per chunk and stage (``_stages``)
        self._uncharged = np.zeros(chunks, dtype=np.int64)  # rows no profile has been charged for yet
        self.prepared_chunks = 0  # chunks prepared so far (a chunk read again counts again)

    def gather(self, rows: np.ndarray, *, label=None, dense=None, ids=None, more=None,
               charge: bool = False) -> PreparedGather:
        """Rows ``rows`` (global numbers, any order) written into the batch's arrays, position ``i`` for
        ``rows[i]`` (as ``ops.gather_rows``). ``charge``: also give each stage's seconds charged to these rows."""
        table = self.table
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        scratch = self._scratch(rows.size)
        found = ops.locate_rows(rows, table.first_row, table.num_rows, scratch.chunk, scratch.local,
                                scratch.touched, scratch.counts)
        touched = scratch.touched
        # (each step over the touched chunks is one native pass: with the caches cold after a batch's gather,
        # the NumPy fancy indexes they were took ~10 us each holding the GIL)
        with self._lock:  # (pinned: those held now stay held until unpinned)
            missing = pin_chunks(touched, found, self._pins, self._kept, scratch.missing)
        try:
            spent = self._ensure(scratch.missing[:missing].tolist(),
                                 time.thread_time if charge else time.perf_counter) if missing else 0.0
            ops.gather_rows(self.blocks, scratch.chunk, scratch.local, label=label, dense=dense, ids=ids, more=more)
        except BaseException:
            with self._lock:
                self._pins[touched[:found]] -= 1
            raise
        with self._lock:
            self._clock += 1
            charged = self._charge(touched[:found], scratch.counts[:found]) if charge else {}
            with_bad = unpin_read_chunks(touched, found, self._pins, self._stamps, self._clock, self._read, self._bad,
                                         scratch.missing)
            bads = [(c, self._held[c]) for c in scratch.missing[:with_bad].tolist()] if with_bad else []
        bad = np.zeros(rows.size, dtype=bool)
        if bads:
            self._note_bads(rows, scratch, bads, bad)
        return PreparedGather(bad, charged, spent)

    def _scratch(self, n: int) -> _Scratch:
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.n != n:
            scratch = self._local.scratch = _Scratch(n, self.table.chunk_rows.size)
        return scratch

    def _charge(self, touched: np.ndarray, counts: np.ndarray) -> dict[str, float]:
        """Each stage's seconds for the rows of ``touched`` (``counts`` of each) not charged before."""
        take = np.minimum(counts, self._uncharged[touched])
        self._uncharged[touched] -= take
        share = take / np.maximum(self.table.chunk_rows[touched], 1)
        seconds = share @ self._seconds[touched]
        return {stage: float(s) for stage, s in zip(self._stages, seconds.tolist())}

    # ---- preparing chunks -----------------------------------------------------------------------------
    def _ensure(self, chunks: list[int], clock: Callable[[], float]) -> float:
        """Every chunk of ``chunks`` (pinned) prepared: those nobody holds or prepares by this thread, one at a
        time (threads start at different chunks, so that those reading one buffer-full share the work), then
        waiting for the others'. Returns the seconds (by ``clock``) this thread spent preparing."""
        spent = 0.0
        start = threading.get_ident() % max(len(chunks), 1)
        pending = chunks[start:] + chunks[:start]
        while pending:
            waiting = []
            for c in pending:
                with self._lock:
                    if c in self._held:
                        continue
                    loading, mine = self._loading.claim(c)
                if not mine:
                    waiting.append((c, loading))
                    continue
                began = clock()
                self._loading.run(c, loading, lambda: self._load(c, clock))
                spent += clock() - began
            for c, loading in waiting:
                loading.wait()
            with self._lock:
                pending = [c for c, _ in waiting if c not in self._held]  # (one whose preparer failed: again)
        return spent

    def warm(self, chunks: list[int]) -> None:
        """The chunks of ``chunks`` that nobody holds or prepares, prepared now, ahead of the batches that will
        need them (others' are not waited for). A chunk that fails is left unprepared, for the batch that needs
        it to meet the error (a waiting batch prepares it again)."""
        for c in chunks:
            with self._lock:
                if c in self._held or c in self._loading:
                    continue
                loading, _ = self._loading.claim(c)
            try:
                self._loading.run(c, loading, lambda: self._load(c, time.perf_counter), share_error=False)
            except Exception:
                pass

    def _load(self, c: int, clock: Callable[[], float]) -> None:
        table = self.table
        rows = int(table.chunk_rows[c])
        began = clock()
        raw, owned = table.load_raw(c)
        read = clock() - began
        try:
            block, address = self._block(rows)
            seconds = dict(self._prepare(raw, block, clock))
            held = _Held(np.array(raw.bad), dict(raw.reasons)) if raw.any_bad else _NO_BAD
        finally:
            if owned:
                table.release_raw(raw)
        seconds[self._read_stage] = seconds.get(self._read_stage, 0.0) + read
        with self._lock:
            for stage in seconds:
                if stage not in self._stages:
                    self._stages.append(stage)
                    self._seconds = np.concatenate([self._seconds, np.zeros((self._seconds.shape[0], 1))], axis=1)
            spent = self._seconds[c]
            for k, stage in enumerate(self._stages):  # (element by element: no array made of a list)
                spent[k] = seconds.get(stage, 0.0)
            self._uncharged[c] = rows
            self._stamps[c] = self._clock  # as recent as the latest batch: not the first dropped
            self._read[c] = False
            self.blocks.set(c, block, address)
            self._since[c] = self._taken
            self._taken += 1
            self._held[c] = held
            self._kept[c] = True
            self._bad[c] = held.bad is not None
            self._held_rows += rows
            self.prepared_chunks += 1
            self._evict()

    def _block(self, rows: int) -> tuple[np.ndarray, int]:
        """A block for ``rows`` rows, and its address: in the memory of a dropped one where one is large enough,
        else new."""
        width = self.layout.width
        words = rows * width
        with self._lock:
            for k, (buffer, address) in enumerate(self._spare):
                if words <= buffer.size <= 2 * words:
                    del self._spare[k]
                    return buffer[:words].reshape(rows, width), address
        buffer = np.empty(words, dtype=np.uint32)
        return buffer.reshape(rows, width), buffer.__array_interface__["data"][0]  # (no ndarray.ctypes: 2 Python calls)

    def _evict(self) -> None:
        """(Holding the lock.) The least recently read chunks that no batch is reading dropped, while more
        than ``cache_rows`` rows are held; chunks prepared ahead that no batch has read yet go last. (Warming
        runs a buffer-full ahead, so a chunk warmed for the next buffer-full was stamped before the current
        one's latest reads: by stamp alone it went first and was prepared again when its batches came, 24 of
        208 chunks in a 1M-row Criteo first epoch.)"""
        if self._held_rows <= self.cache_rows:
            return
        # Read ones first, then by stamp, oldest first, ties in the order they were held: one native pass (with
        # the caches cold after a parse, a NumPy sort and its index arrays took ~40 us a chunk holding the GIL).
        blocks = self.blocks
        n = least_recently_read(self._kept, self._pins, self._read, self._stamps, self._since, blocks.chunk_rows,
                                self._held_rows - self.cache_rows, self._dropping)
        for c in self._dropping[:n].tolist():
            address = int(blocks.addresses[c])
            block = blocks.drop(c)
            del self._held[c]
            self._kept[c] = self._bad[c] = False
            self._held_rows -= int(blocks.chunk_rows[c])
            if block is not None and block.base is not None:
                self._spare.append((block.base, address))
                del self._spare[:-SPARE_BLOCKS]

    # ---- bad rows -------------------------------------------------------------------------------------
    def _note_bads(self, rows: np.ndarray, scratch: _Scratch, bads: list, bad: np.ndarray) -> None:
        """Mark the bad rows among ``rows`` and note each (raise, or list it once), in the order asked for."""
        noted = []
        for c, held in bads:
            at = np.flatnonzero(scratch.chunk == c)
            here = held.bad[scratch.local[at]]
            bad[at[here]] = True
            noted += [(int(k), held, c) for k in at[here].tolist()]
        for k, held, c in sorted(noted, key=lambda item: item[0]):
            self.table.note_bad(int(rows[k]), held, c)
