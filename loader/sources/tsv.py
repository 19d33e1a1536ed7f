"""TSV files (plain or gzip) as chunks of lines, parsed when read.

A plain file is cut into chunks of about ``CHUNK_BYTES`` at line starts; any chunk is read on its own (one
``pread``). A gzip file cannot be read from the middle, so its chunks (``CHUNK_LINES`` lines each) form one
group, read front to back by one decompressor kept per file. The index (lines per chunk) is built by one
pass over the file and kept beside it in ``<file>.feedline-index.json`` (size and modification time must
match), so opening the same files again costs nothing.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import threading
import zlib

import numpy as np

from ...pipelines.tabular import Column
from .chunked import ChunkIndex, RowsChunk
from .tabular import RowError
from .text_parse import TSV, Layout, TextSyntax, parse_text

log = logging.getLogger("feedline")
GZIP_MAGIC = b"\x1f\x8b"
CHUNK_BYTES = 1 << 20
CHUNK_LINES = 1 << 12
SCAN_BYTES = 1 << 24
INDEX_SUFFIX = ".feedline-index.json"
INDEX_VERSION = 1
_unwritable_warned: set[str] = set()


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

    # ---- indexing ---------------------------------------------------------------------------------
    def index(self, path: str) -> ChunkIndex:
        stat = os.stat(path)
        cached = _read_cache(path, stat)
        if cached is not None:
            return cached
        index = _index_gzip(path) if is_gzip(path) else _index_plain(path, stat.st_size)
        _write_cache(path, stat, index)
        return index

    # ---- reading ----------------------------------------------------------------------------------
    def load(self, path: str, index: ChunkIndex, chunk: int) -> RowsChunk:
        rows = int(index.rows[chunk])
        if index.groups[chunk] < 0:  # plain text: read the chunk's bytes on their own
            with open(path, "rb") as f:
                data = os.pread(f.fileno(), int(index.stops[chunk] - index.starts[chunk]), int(index.starts[chunk]))
        else:
            with self._lock:
                cursor = self._cursors.get(path)
                if cursor is None:
                    cursor = self._cursors[path] = _GzipCursor(path)
            data = cursor.lines(int(index.lines[chunk]), rows)
        return self.parse(data, rows)

    def parse(self, data: bytes, rows: int) -> RowsChunk:
        """``rows`` lines of text (the last one's newline optional) as a chunk of rows: the integer columns (int,
        hex, string) in one block, the float columns in another, the list columns by name (``text_parse``)."""
        chunk = parse_text(data, rows, self.layout)
        return RowsChunk(chunk.lists, chunk.bad, chunk.reasons, chunk.ints, chunk.missing,
                         chunk.floats if chunk.floats.shape[1] else None)


def _index_plain(path: str, size: int) -> ChunkIndex:
    """Chunks of about CHUNK_BYTES, each starting at a line start, and the lines in each."""
    if size == 0:
        return ChunkIndex.empty()
    with open(path, "rb") as f:
        ends = []  # one past each newline
        offset = 0
        while True:
            block = f.read(SCAN_BYTES)
            if not block:
                break
            ends.append(np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 0x0A) + offset + 1)
            offset += len(block)
    line_ends = np.concatenate(ends) if ends else np.zeros(0, dtype=np.int64)
    if line_ends.size == 0 or line_ends[-1] != size:
        line_ends = np.append(line_ends, size)  # a last line without its newline
    line_ends = line_ends.astype(np.int64)
    # The last line of each chunk: the first line ending at or beyond each CHUNK_BYTES mark.
    marks = np.arange(CHUNK_BYTES, size, CHUNK_BYTES)
    cut_lines = np.unique(np.concatenate([np.searchsorted(line_ends, marks), [line_ends.size - 1]]))
    stops = line_ends[cut_lines]
    starts = np.concatenate([[0], stops[:-1]])
    rows = np.diff(np.concatenate([[-1], cut_lines]))
    lines = np.concatenate([[1], cut_lines[:-1] + 2])
    return ChunkIndex(starts, stops, lines.astype(np.int64), rows.astype(np.int64),
                      np.full(rows.size, -1, dtype=np.int64))


def _index_gzip(path: str) -> ChunkIndex:
    """One group of CHUNK_LINES-line chunks: the lines counted by decompressing the file once."""
    lines, last_byte = 0, b"\n"
    try:
        with gzip.open(path, "rb") as f:
            while True:
                block = f.read(SCAN_BYTES)
                if not block:
                    break
                lines += block.count(b"\n")
                last_byte = block[-1:]
    except (OSError, EOFError, zlib.error) as e:
        raise RowError(path, None, f"is not a readable gzip file: {e}") from None
    if last_byte != b"\n":
        lines += 1  # a last line without its newline
    starts = np.arange(0, lines, CHUNK_LINES, dtype=np.int64)
    rows = np.minimum(CHUNK_LINES, lines - starts)
    return ChunkIndex(starts, starts + rows, starts + 1, rows, np.zeros(rows.size, dtype=np.int64))


class _GzipCursor:
    """One decompressor per gzip file, moving forward; asked for an earlier line, it starts again."""

    def __init__(self, path: str):
        self.path = path
        self.lock = threading.Lock()
        self._open()

    def _open(self) -> None:
        self.file = gzip.open(self.path, "rb")
        self.line = 1        # the line that ``pending`` starts with
        self.pending = b""

    def lines(self, first: int, count: int) -> bytes:
        with self.lock:
            if first < self.line:
                self.file.close()
                self._open()
            try:
                self._skip(first - self.line)
                return self._take(count)
            except (OSError, EOFError, zlib.error) as e:
                raise RowError(self.path, None, f"is not a readable gzip file: {e}") from None

    def _fill(self) -> bool:
        block = self.file.read(SCAN_BYTES // 4)
        self.pending += block
        return bool(block)

    def _take(self, count: int) -> bytes:
        while self.pending.count(b"\n") < count:
            if not self._fill():
                break
        cut = -1
        for _ in range(count):
            cut = self.pending.find(b"\n", cut + 1)
            if cut < 0:
                cut = len(self.pending) - 1
                break
        out, self.pending = self.pending[:cut + 1], self.pending[cut + 1:]
        self.line += count
        return out

    def _skip(self, count: int) -> None:
        while count > 0:
            newlines = self.pending.count(b"\n")
            if newlines >= count:
                self._take(count)
                return
            self.line += newlines
            count -= newlines
            self.pending = self.pending[self.pending.rfind(b"\n") + 1:]
            if not self._fill():
                return


def _cache_path(path: str) -> str:
    return path + INDEX_SUFFIX


def _read_cache(path: str, stat: os.stat_result) -> ChunkIndex | None:
    try:
        with open(_cache_path(path)) as f:
            saved = json.load(f)
        if (saved.get("version"), saved.get("size"), saved.get("mtime_ns"), saved.get("chunk_bytes"),
                saved.get("chunk_lines")) != (INDEX_VERSION, stat.st_size, stat.st_mtime_ns, CHUNK_BYTES,
                                              CHUNK_LINES):
            return None
        return ChunkIndex(*(np.asarray(saved[k], dtype=np.int64) for k in ("starts", "stops", "lines", "rows",
                                                                           "groups")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(path: str, stat: os.stat_result, index: ChunkIndex) -> None:
    target = _cache_path(path)
    payload = {"version": INDEX_VERSION, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
               "chunk_bytes": CHUNK_BYTES, "chunk_lines": CHUNK_LINES,
               **{k: getattr(index, k).tolist() for k in ("starts", "stops", "lines", "rows", "groups")}}
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(payload, f)
        os.replace(tmp, target)
    except OSError as e:
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in _unwritable_warned:
            _unwritable_warned.add(folder)
            log.warning("feedline: cannot keep the line index of %s beside it (%s); it is counted again at "
                        "every open", path, e.strerror or e)
