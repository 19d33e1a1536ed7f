"""TSV files (plain or gzip) as chunks of lines, parsed when read.

Both kinds are cut by the same line index (``line_index``): chunks of about 1 MiB at line starts, each with its
byte range, first line and line count, so the index is O(chunks) and a line too long to read is a chunk of
its own (one bad row). A plain file's chunk is read on its own (one ``pread``); a gzip file cannot be read
from the middle, so its chunks (offsets in the decompressed stream) form one group, read front to back by one
decompressor per file (``gzip_stream``). The index is kept in a hidden sidecar (``index_store``), used only
while the file's content fingerprint is the one it was made from, and only when every value in it is one a
scan could give; otherwise the file is indexed again. Reading a chunk checks that it still holds the lines the
index says, so a file changed after it was indexed raises an error naming it instead of shifting rows.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
from collections import OrderedDict

import numpy as np

from ...pipelines.tabular import Column
from . import index_store
from .chunked import ChunkIndex, RowsChunk
from .gzip_stream import GZIP_MAGIC, GzipError, GzipStream, Mark
from .growing_index import GrowingIndex
from .index_store import Fingerprint
from .line_index import BLOCK_BYTES, LineScan, from_payload, is_long_line, long_line_reason, to_payload
from .table_rows import RowError
from .text_syntax import TSV, Layout, TextSyntax

log = logging.getLogger("feedline")
MAX_MARKS = 64  # marks kept per gzip file being read (10-40 KB each): chunk starts of the last 64 MiB of text
NEAR_BYTES = 4 << 20  # a chunk this close after a mark is read from the mark on a stream of its own
STASH_BYTES = 16 << 20  # chunks passed over on the way to a later one, kept for the thread that asks next
KEEP_CHUNK_BYTES = 4 << 20  # a passed chunk larger than this (a long line) is not kept
ACTIVE_CURSORS = 2  # gzip files whose marks and kept chunks are held: the one being read and the one before
INDEX_KIND = "lines"
INDEX_VERSION = 2


def is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


class TsvFormat:
    def __init__(self, columns: tuple[Column, ...], syntax: TextSyntax = TSV, layout: Layout | None = None):
        """``columns`` in the files' order, split as ``syntax`` says; or, for files with a header, ``layout``:
        which field of a line holds which declared column."""
        self.columns = columns
        self.layout = Layout(columns, syntax) if layout is None else layout
        self._cursors: dict[str, _GzipCursor] = {}
        self._lock = threading.Lock()
        self._built: dict[str, tuple[Fingerprint, tuple]] = {}  # path -> (fingerprint, arrays) of lazy scans

    # ---- indexing ----------------------------------------------------------------------------------
    def index(self, path: str) -> ChunkIndex:
        """The file's chunks: from its sidecar when that still describes it, else by one scan (then kept)."""
        gz = is_gzip(path)
        before = Fingerprint.of(path)
        built = self._built.get(path)  # a lazy scan's index of this very content (``index_lazily``)
        saved = index_store.load(path, INDEX_KIND, INDEX_VERSION, before)
        arrays = from_payload(saved, None if gz else before.size) if saved is not None else None
        if arrays is None and built is not None and built[0] == before:
            arrays = built[1]
        if arrays is None:
            arrays = _scan(path, gz)
            if Fingerprint.of(path) == before:  # never keep an index of content that moved under the scan
                index_store.save(path, INDEX_KIND, INDEX_VERSION, before, to_payload(*arrays))
        return _chunk_index(arrays, gz)

    def index_lazily(self, path: str, on_publish, on_complete=None) -> GrowingIndex | None:
        """A gzip file whose index is not remembered: its index built on a thread of its own (``growing_index``),
        its chunks handed to ``on_publish(chunk_index, complete)`` as they close, kept in the sidecar when
        complete (as ``index`` keeps it), then ``on_complete(chunk_index)``. None for a plain file (its scan is
        fast) or a gzip file whose index is remembered: then ``index`` gives it."""
        if not is_gzip(path):
            return None
        before = Fingerprint.of(path)
        saved = index_store.load(path, INDEX_KIND, INDEX_VERSION, before)
        if saved is not None and from_payload(saved, None) is not None:
            return None

        def complete(arrays) -> None:
            try:
                same = Fingerprint.of(path) == before  # never keep an index of content that moved under the scan
            except OSError:
                same = False
            if same:
                self._built[path] = (before, arrays)
                index_store.save(path, INDEX_KIND, INDEX_VERSION, before, to_payload(*arrays))
            if on_complete is not None:
                on_complete(_chunk_index(arrays, True))

        return GrowingIndex(path, lambda arrays, done: on_publish(_chunk_index(arrays, True), done), complete,
                            keeper=self._scan_keeper(path))

    def _scan_keeper(self, path: str) -> _GzipCursor:
        """The file's cursor, given the first chunks and marks of its index's scan (``growing_index.Keeper``)."""
        with self._lock:
            cursor = self._cursors.get(path)
            if cursor is None:
                cursor = self._cursors[path] = _GzipCursor(path, np.zeros(0, dtype=np.int64))
        return cursor

    # ---- reading ----------------------------------------------------------------------------------
    def load(self, path: str, index: ChunkIndex, chunk: int) -> RowsChunk:
        start, stop = int(index.starts[chunk]), int(index.stops[chunk])
        rows, line = int(index.rows[chunk]), int(index.lines[chunk])
        last = chunk == index.rows.size - 1
        gz = index.groups[chunk] >= 0
        if is_long_line(start, stop, rows):
            if gz:
                self._cursor(path, index).read(start, stop, keep=False)
            return _one_bad_row(self.parse(b"\n", 1), long_line_reason(start, stop))
        if gz:
            before, data = self._cursor(path, index).read(start, stop)
        else:
            before, data = _pread(path, start, stop)
        if len(data) == stop - start and before in (b"", b"\n") and (data.endswith(b"\n") or last):
            try:
                return self.parse(data, rows)
            except LinesMoved:
                pass
        raise _changed(path, line, rows, data, stop - start)

    def _cursor(self, path: str, index: ChunkIndex) -> _GzipCursor:
        """The file's cursor; the cursors of files read less lately than the last ``ACTIVE_CURSORS`` let go of
        what they hold (a gzip file is read front to back as one piece, so reading moves from file to file)."""
        with self._lock:
            cursor = self._cursors.pop(path, None)
            if cursor is None:
                cursor = _GzipCursor(path, index.starts)
            elif cursor.starts.size < index.starts.size:  # an index grown since (``index_lazily``)
                cursor.starts = index.starts
            self._cursors[path] = cursor  # the most lately used last
            idle = list(self._cursors.values())[:-ACTIVE_CURSORS]
        for old in idle:
            old.release()
        return cursor

    def parse(self, data: bytes, rows: int) -> RowsChunk:
        """``rows`` lines of text (the last one's newline optional) as a chunk of rows: the integer columns (int,
        hex, string) in one block, the float columns in another, the list columns by name (``text_parse``).
        Text of more or fewer lines raises ``LinesMoved`` (the parser counts them as it reads)."""
        chunk = _parse_text()(data, rows, self.layout)
        if not chunk.exact:
            raise LinesMoved
        return RowsChunk(chunk.lists, chunk.bad, chunk.reasons, chunk.ints, chunk.missing,
                         chunk.floats if chunk.floats.shape[1] else None)


@functools.cache
def _parse_text():
    """``text_parse.parse_text``, imported at the first chunk (numba's: loaded on a thread of its own while the
    files are indexed), then looked up once, not imported again for every chunk."""
    from .text_parse import parse_text

    return parse_text


def _chunk_index(arrays: tuple[np.ndarray, ...], gz: bool) -> ChunkIndex:
    """The line index's arrays (starts, stops, lines, rows) as chunks: a gzip file's are one read group (one
    stream), a plain file's each stand alone (group -1)."""
    starts, stops, lines, rows = arrays
    return ChunkIndex(starts, stops, lines, rows, np.full(rows.size, 0 if gz else -1, dtype=np.int64))


class LinesMoved(Exception):
    """A chunk's bytes are not the whole lines its index says (the file changed after it was indexed)."""


def _scan(path: str, gz: bool) -> tuple[np.ndarray, ...]:
    """One pass over the file (its decompressed stream for gzip), a block at a time."""
    scan = LineScan()
    if gz:
        try:
            with GzipStream(path) as stream:
                while block := stream.read(BLOCK_BYTES):
                    scan.feed(block)
        except GzipError as e:
            raise RowError(path, None, f"is not a readable gzip file: {e}") from None
    else:
        block = bytearray(BLOCK_BYTES)
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(block):
                scan.feed(block, n)
    return scan.finish().arrays()


def _pread(path: str, start: int, stop: int) -> tuple[bytes, bytes]:
    """The byte before ``start`` (empty at 0) and the bytes ``[start, stop)`` (fewer where the file is shorter).
    Two reads, so the chunk's bytes are the very object ``pread`` made: one read of both sliced apart copied the
    chunk (~1 MiB) into a fresh object, and the copy's pages were faulted in, for every chunk of every epoch."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        before = os.pread(fd, 1, start - 1) if start > 0 else b""
        return before, os.pread(fd, stop - start, start)
    finally:
        os.close(fd)


def _changed(path: str, line: int, rows: int, data: bytes, size: int) -> RowError:
    """The error for a chunk that is no longer the one the index describes (whole lines, ``rows`` of them)."""
    ends = data.count(b"\n")
    return RowError(path, None, f"changed since it was indexed: lines {line}-{line + rows - 1} are no longer where "
                                f"they were (found {len(data)} of {size} bytes holding {ends} line ends); open it "
                                f"again")


def _one_bad_row(chunk: RowsChunk, reason: str) -> RowsChunk:
    """A parsed one-row chunk turned into one bad row with ``reason`` (zero values, every scalar missing)."""
    def zeros(a):
        return None if a is None else np.zeros_like(a)

    columns = {k: (type(v)(np.zeros_like(v.values), np.ones_like(v.missing)) if hasattr(v, "missing") else v)
               for k, v in chunk.columns.items()}
    return chunk._replace(columns=columns, bad=np.ones(1, dtype=bool), reasons={0: reason}, ints=zeros(chunk.ints),
                          floats=zeros(chunk.floats),
                          missing=None if chunk.missing is None else np.ones_like(chunk.missing))


class _GzipCursor:
    """One gzip file's decompressed bytes, read by chunk. Threads reading one buffer-full start at different
    chunks, so requests come out of order; none of them makes the file decompress again from its top (which
    made an epoch quadratic):

    - a main stream moves forward; the chunks it passes over on the way to a later one are kept (up to
      ``STASH_BYTES``) for the thread that asks for them next, so passing costs no second decompression;
    - at every chunk start it leaves a mark (``GzipStream.mark``), so a chunk behind it that is no longer kept is
      read from its mark on a stream of its own (two threads then decompress different chunks at once);
    - a chunk far from any mark (a new epoch) moves the main stream back to the nearest mark, or to the top;
    - a file indexed while it is read (``index_lazily``): its scan hands over the first chunks it closes (up to
      ``STASH_BYTES``, kept as passed chunks are) and marks at its first blocks (``offer_chunk``, ``offer_mark``),
      so the first batches decompress nothing the scan has decompressed."""

    def __init__(self, path: str, starts: np.ndarray):
        self.path = path
        self.starts = starts  # the chunks' starts: where marks are left
        self.lock = threading.Lock()  # the main stream's
        self.stream: GzipStream | None = None
        self.last = b""  # the byte before the main stream's position
        self.kept_lock = threading.Lock()  # the marks' and the kept chunks'
        self.marks: OrderedDict[int, tuple[Mark, bytes]] = OrderedDict()  # position -> (mark, byte before it)
        # start -> (stop, byte before, bytes, whether it stays after a read: the scan's chunks do, see ``offer_chunk``)
        self.kept: OrderedDict[int, tuple[int, bytes, bytes, bool]] = OrderedDict()
        self.kept_bytes = 0

    def read(self, start: int, stop: int, *, keep: bool = True) -> tuple[bytes, bytes]:
        """The byte before ``start`` and the bytes ``[start, stop)`` of the decompressed stream (fewer where it
        ends sooner); with ``keep=False`` the bytes are passed over, not kept."""
        with self.kept_lock:
            kept = self.kept.get(start)
            if kept is not None and not kept[3]:
                del self.kept[start]
                self.kept_bytes -= len(kept[2])
        if kept is not None and kept[0] == stop:
            return kept[1], kept[2] if keep else b""
        try:
            with self.lock:
                mark = self._mark_before(start)
                main = self.stream.position if self.stream is not None and self.stream.position <= start else None
                if main is not None and (mark is None or mark[0].position <= main):
                    return self._read(self.stream, start, stop, keep, main=True)
                if mark is None or start - mark[0].position > NEAR_BYTES:
                    # far from anything read lately (a new epoch): the main stream goes back, and reads on
                    if self.stream is not None:
                        self.stream.close()
                    self.stream = GzipStream(self.path) if mark is None else GzipStream.resume(self.path, mark[0])
                    self.last = b"" if mark is None else mark[1]
                    return self._read(self.stream, start, stop, keep, main=True)
            with GzipStream.resume(self.path, mark[0]) as stream:  # near a mark: a stream of its own
                return self._read(stream, start, stop, keep, main=False, last=mark[1])
        except GzipError as e:
            raise RowError(self.path, None, f"is not a readable gzip file: {e}") from None

    # ---- what the file's index scan hands over (``growing_index.Keeper``) ------------------------------
    def offer_mark(self, mark: Mark, before: bytes) -> bool:
        """A mark the scan took; kept while the scan's marks are fewer than half of ``MAX_MARKS`` (the readers'
        own marks push them out as they read on). False: no more."""
        with self.kept_lock:
            if len(self.marks) >= MAX_MARKS // 2:
                return False
            self.marks.setdefault(mark.position, (mark, before))
            return True

    def offer_chunk(self, start: int, stop: int, before: bytes, data: bytes) -> bool:
        """A chunk the scan closed, kept while the kept chunks stay within ``STASH_BYTES`` (a chunk larger than
        ``KEEP_CHUNK_BYTES``, a long line, is passed by), for every read until chunks kept later push it out
        (the first batches may read a chunk twice: warmed ahead, and gathered before the warming is done). False:
        no more."""
        if len(data) > KEEP_CHUNK_BYTES:
            return True
        with self.kept_lock:
            if self.kept_bytes + len(data) > STASH_BYTES:
                return False
            if start not in self.kept:
                self.kept[start] = (stop, before, data, True)
                self.kept_bytes += len(data)
            return True

    def release(self) -> None:
        """Let go of the stream, the marks and the kept chunks (a later read starts again from the top)."""
        with self.lock, self.kept_lock:
            if self.stream is not None:
                self.stream.close()
            self.stream, self.last = None, b""
            self.marks.clear()
            self.kept.clear()
            self.kept_bytes = 0

    def _mark_before(self, position: int) -> tuple[Mark, bytes] | None:
        with self.kept_lock:
            best = max((p for p in self.marks if p <= position), default=None)
            return None if best is None else self.marks[best]

    def _read(self, stream: GzipStream, start: int, stop: int, keep: bool, *, main: bool,
              last: bytes = b"") -> tuple[bytes, bytes]:
        last = self.last if main else last
        last = self._pass(stream, start, None, last)
        before = last
        pieces: list[bytes] = []
        last = self._pass(stream, stop, pieces if keep else None, last)
        if main:
            self.last = last
        return before, b"".join(pieces)

    def _pass(self, stream: GzipStream, to: int, into: list | None, last: bytes) -> bytes:
        """Read ``stream`` on to position ``to``, leaving a mark at every chunk start on the way and, when
        ``into`` is None (passing over), keeping the whole chunks passed; the last byte."""
        passing: tuple[int, bytes, list] | None = None  # a chunk being passed over: start, byte before, pieces
        while stream.position < to:
            position = stream.position
            k = int(np.searchsorted(self.starts, position, side="right"))  # the next chunk start is starts[k]
            if k and int(self.starts[k - 1]) == position:
                if passing is not None:
                    self._keep(passing, position)
                passing = (position, last, []) if into is None else None
                if position not in self.marks:
                    with self.kept_lock:
                        self.marks[position] = (stream.mark(), last)
                        while len(self.marks) > MAX_MARKS:
                            self.marks.popitem(last=False)
            boundary = min(to, int(self.starts[k])) if k < self.starts.size else to
            block = stream.read(min(boundary - position, BLOCK_BYTES))
            if not block:
                return last
            last = block[-1:]
            if into is not None:
                into.append(block)
            elif passing is not None:
                passing[2].append(block)
                if sum(map(len, passing[2])) > KEEP_CHUNK_BYTES:  # a line too long to keep: passed, not kept
                    passing = None
        if passing is not None and _is_start(self.starts, stream.position):
            self._keep(passing, stream.position)
        return last

    def _keep(self, passing: tuple[int, bytes, list], stop: int) -> None:
        start, before, pieces = passing
        data = b"".join(pieces)
        with self.kept_lock:
            if start not in self.kept:
                self.kept[start] = (stop, before, data, False)
                self.kept_bytes += len(data)
            while self.kept_bytes > STASH_BYTES:
                _, (_, _, dropped, _) = self.kept.popitem(last=False)
                self.kept_bytes -= len(dropped)


def _is_start(starts: np.ndarray, position: int) -> bool:
    k = int(np.searchsorted(starts, position))
    return k < starts.size and int(starts[k]) == position
