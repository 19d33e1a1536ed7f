"""A gzip file's line index built on a thread of its own while its first rows are already being read.

A gzip file cannot be read from the middle, so its line index (``line_index``) costs one decompression of the
whole file. Opened lazily, the scan runs on a daemon thread and publishes the chunks it has closed as it goes
(every ``1/PUBLISH_SHARE`` more chunks, so publishing costs O(chunks) in all); readers wait only until the
index covers the rows they need (``wait_rows``). When the scan ends the index is complete, exact, and kept in
the sidecar as a full scan would have kept it (``index_store``), so the next open reads it at once.

An error met by the scan (a file cut short, corrupt, with other bytes after its last member) is kept and
raised, naming the file, to whoever waits for rows past it, and to every later wait.

The first batches read the file's first chunks, which the scan has just decompressed: so that they are not
decompressed a second time on the way to the first batch, the scan hands them to a ``Keeper`` (the reader's
``tsv._GzipCursor``) while it takes them: each closed chunk's bytes, and a mark (``GzipStream.mark``) at each
block it reads, from which a reader resumes instead of decompressing from the top. The keeper bounds what it
takes; once it declines, the scan keeps no more blocks than it needs to index.
"""
from __future__ import annotations

import os
import threading
from typing import Callable, Protocol

import numpy as np

from .gzip_stream import GzipError, GzipStream, Mark
from .line_index import BLOCK_BYTES, LineScan
from .table_rows import RowError

PUBLISH_SHARE = 16  # chunks are published once 1/16 more than were published have closed (and at the end)

Publish = Callable[[tuple[np.ndarray, ...], bool], None]


class Keeper(Protocol):
    """Takes what the scan decompressed, for the reads that follow it; each returns False once it takes no more."""

    def offer_mark(self, mark: Mark, before: bytes) -> bool: ...  # ``before``: the byte before the mark (b"" at 0)

    def offer_chunk(self, start: int, stop: int, before: bytes, data: bytes) -> bool: ...


class GrowingIndex:
    """The line index of the gzip file ``path``, built on a thread started here. ``on_publish(arrays,
    complete)`` is called on that thread with the four index arrays (``line_index``: starts, stops, lines,
    rows) each time more chunks close, before any waiter sees the new rows; ``on_complete(arrays)`` once, last,
    with the whole index (what it raises is logged by the caller's own handler, never lost silently: it is kept
    as the index's error)."""

    def __init__(self, path: str, on_publish: Publish, on_complete: Callable[[tuple[np.ndarray, ...]], None],
                 keeper: Keeper | None = None):
        """``keeper``: given the scan's first chunks and marks (see the module's docstring), or None."""
        self.path = path
        self._keeper = keeper
        self.size = os.path.getsize(path)  # compressed bytes
        self._on_publish, self._on_complete = on_publish, on_complete
        self._cond = threading.Condition()
        self.rows = 0           # rows indexed (published) so far
        self.complete = False
        self.error: Exception | None = None
        self._consumed = 0      # compressed bytes behind the published chunks
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="feedline-gzip-index", daemon=True)
        self.thread.start()

    # ---- what readers ask --------------------------------------------------------------------------
    def wait_rows(self, rows: int) -> tuple[int, bool]:
        """Until at least ``rows`` rows are indexed or the index is complete: ``(rows indexed, complete)``;
        the scan's error, if it met one before ``rows`` rows."""
        with self._cond:
            while not self.complete and self.error is None and self.rows < rows:
                self._cond.wait()
            if self.error is not None and self.rows < rows:
                raise self.error
            return self.rows, self.complete

    def wait_complete(self) -> int:
        """Until the index is complete: the file's rows."""
        return self.wait_rows(1 << 62)[0]

    def estimate_rows(self) -> int:
        """The file's rows: exact once complete, else the rows indexed so far scaled by the compressed bytes
        behind them (never fewer than those indexed)."""
        with self._cond:
            if self.complete or not self._consumed:
                return self.rows
            return max(self.rows, int(round(self.rows * self.size / self._consumed)))

    def stop(self) -> None:
        """Give up the scan (its table was closed): the thread ends after the block in hand, keeps no sidecar,
        and a later wait for rows not yet indexed raises instead of waiting."""
        self._stopped.set()

    # ---- the scan ----------------------------------------------------------------------------------
    def _run(self) -> None:
        scan = LineScan()
        published = 0
        handing = _Handing(self._keeper) if self._keeper is not None else None
        try:
            with GzipStream(self.path) as stream:
                while True:
                    if handing is not None:
                        handing.mark(stream)
                    block = stream.read(BLOCK_BYTES)
                    if not block:
                        break
                    if self._stopped.is_set():
                        self._fail(RowError(self.path, None, "was closed before its index was complete"))
                        return
                    scan.feed(block)
                    if handing is not None and not handing.chunks(scan, block, stream.position):
                        handing = None
                    closed = len(scan.rows)
                    if closed and closed - published >= max(1, published // PUBLISH_SHARE):
                        self._publish(scan, stream.compressed_position, False)
                        published = closed
            scan.finish()
            if handing is not None:
                handing.chunks(scan, b"", scan.size)
            arrays = scan.arrays()
            self._on_publish(arrays, True)
            self._on_complete(arrays)
            with self._cond:
                self.rows, self._consumed, self.complete = int(arrays[3].sum()), self.size, True
                self._cond.notify_all()
        except GzipError as e:
            self._fail(RowError(self.path, None, f"is not a readable gzip file: {e}"))
        except BaseException as e:  # (kept for the waiters: a reader never waits for a scan that died)
            self._fail(e)

    def _publish(self, scan: LineScan, consumed: int, complete: bool) -> None:
        n = len(scan.rows)
        arrays = tuple(np.asarray(getattr(scan, k)[:n], dtype=np.int64) for k in ("starts", "stops", "lines", "rows"))
        self._on_publish(arrays, complete)
        with self._cond:
            self.rows, self._consumed = int(arrays[3].sum()), consumed
            self._cond.notify_all()

    def _fail(self, error: BaseException) -> None:
        with self._cond:
            self.error = error
            self._cond.notify_all()


class _Handing:
    """The scan's side of handing its first chunks to a ``Keeper``: the blocks read since the first chunk not yet
    handed (with the byte before it), cut into that chunk's bytes when it closes. It holds at most
    ``MAX_HELD`` bytes (a line longer than that ends the handing: such a chunk is never kept anyway)."""

    MAX_HELD = 4 * BLOCK_BYTES

    def __init__(self, keeper: Keeper):
        self.keeper = keeper
        self.blocks: list[tuple[int, bytes]] = []  # (offset in the stream, bytes), in order
        self.handed = 0        # chunks handed so far
        self.marking = True    # whether marks are still taken
        self.last = b""        # the stream's last byte so far

    def mark(self, stream: GzipStream) -> None:
        if self.marking and stream.position:  # (the top needs no mark: a stream starts there)
            self.marking = self.keeper.offer_mark(stream.mark(), self.last)

    def chunks(self, scan: LineScan, block: bytes, end: int) -> bool:
        """``block`` (ending at ``end``) read and fed: each chunk closed since is handed. False: hand no more."""
        if block:
            self.blocks.append((end - len(block), block))
            self.last = block[-1:]
        while self.handed < len(scan.starts):
            start, stop = scan.starts[self.handed], scan.stops[self.handed]
            if not self.keeper.offer_chunk(start, stop, self._bytes(start - 1, start) if start else b"",
                                           self._bytes(start, stop)):
                self.blocks.clear()
                return False
            self.handed += 1
        # Held: what the next chunk needs (chunks are contiguous: it starts where the last one handed stops), from
        # the byte before its start.
        keep_from = (scan.stops[self.handed - 1] if self.handed else 0) - 1
        while self.blocks and self.blocks[0][0] + len(self.blocks[0][1]) <= keep_from:
            self.blocks.pop(0)
        if sum(len(b) for _, b in self.blocks) > self.MAX_HELD:
            self.blocks.clear()
            return False
        return True

    def _bytes(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the stream, from the blocks held."""
        return b"".join(b[max(start - o, 0):stop - o] for o, b in self.blocks if o < stop and o + len(b) > start)
