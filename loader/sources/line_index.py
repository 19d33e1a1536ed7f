"""The line index of a text file: its bytes cut into chunks of about ``CHUNK_BYTES`` at line starts, each with
its byte range, first line (1-based) and line count.

Memory is O(chunks), never O(lines): the bytes are fed a block at a time, line ends found with ``find`` and
newlines counted with a NumPy comparison into a reused mask, so a file of short lines costs no more to index
than one of long lines, and no list of line ends is ever made. A line of more than ``MAX_LINE_BYTES`` bytes (its newline included) is a chunk of
its own that is never read into memory: reading it gives one bad row, ``file:line`` and its length.

The same scan indexes a plain file (byte offsets in the file) and a gzip file (offsets in its decompressed
stream), and the index is kept in a sidecar (``index_store``) as four integer lists, validated when read back.
"""
from __future__ import annotations

import hashlib

import numpy as np

CHUNK_BYTES = 1 << 20
MAX_LINE_BYTES = 1 << 20
BLOCK_BYTES = 1 << 20  # at most MAX_LINE_BYTES: a line longer than that then always spans a block boundary
_KEYS = ("starts", "stops", "lines", "rows")
_INT64_MAX = (1 << 63) - 1


class LineScan:
    """Chunks of a byte stream fed front to back with :meth:`feed`, complete after :meth:`finish`."""

    def __init__(self) -> None:
        self.size = 0          # bytes fed so far
        self.starts: list[int] = []
        self.stops: list[int] = []
        self.lines: list[int] = []
        self.rows: list[int] = []
        self._line = 1         # the number of the line under way
        self._line_start = 0   # where it starts
        self._chunk_start = 0
        self._chunk_rows = 0
        self._mask: np.ndarray | None = None

    def feed(self, block: bytes | bytearray, length: int | None = None) -> None:
        """The next ``length`` bytes of the stream: ``block``'s first ``length`` (default: all of it)."""
        length = len(block) if length is None else length
        if length <= BLOCK_BYTES:
            self._feed(block, length)
            return
        for a in range(0, length, BLOCK_BYTES):  # a line within a block is then never longer than the limit
            piece = bytes(block[a:min(a + BLOCK_BYTES, length)])
            self._feed(piece, len(piece))

    def _count(self, block, a: int, b: int) -> int:
        """Newlines in ``block[a:b]`` (a NumPy comparison into a reused mask: faster than ``bytes.count``)."""
        if self._mask is None:
            self._mask = np.empty(BLOCK_BYTES, dtype=bool)
        return int(np.count_nonzero(np.equal(np.frombuffer(block, np.uint8, b - a, a), 0x0A, out=self._mask[:b - a])))

    def _feed(self, block, n: int) -> None:
        o = self.size
        self.size += n
        first = block.find(b"\n", 0, n)
        if first < 0:
            return  # the line under way goes on
        self._line_ends(o + first + 1)
        pos, last = first + 1, block.rfind(b"\n", 0, n)
        while pos <= last:
            mark = self._chunk_start + CHUNK_BYTES - 1 - o  # the chunk ends with the line that holds this byte
            if mark > last:
                break
            p = block.find(b"\n", max(pos, mark), n)
            self._add(self._count(block, pos, p + 1), o + p + 1)
            pos = p + 1
        if pos <= last:
            self._add(self._count(block, pos, last + 1), o + last + 1)
        self._line_start = o + last + 1

    def _line_ends(self, end: int) -> None:
        """The line under way ends at ``end`` (one past its newline, or the end of the data)."""
        if end - self._line_start > MAX_LINE_BYTES:
            if self._chunk_rows:
                self._close(self._line_start)
            self._emit(self._line_start, end, self._line, 1)
            self._line += 1
            self._chunk_start = end
        else:
            self._add(1, end)
        self._line_start = end

    def _add(self, count: int, end: int) -> None:
        """``count`` more lines in the chunk under way, the last ending at ``end``."""
        self._line += count
        self._chunk_rows += count
        if end - self._chunk_start >= CHUNK_BYTES:
            self._close(end)

    def _close(self, end: int) -> None:
        self._emit(self._chunk_start, end, self._line - self._chunk_rows, self._chunk_rows)
        self._chunk_start, self._chunk_rows = end, 0

    def _emit(self, start: int, stop: int, line: int, rows: int) -> None:
        self.starts.append(start)
        self.stops.append(stop)
        self.lines.append(line)
        self.rows.append(rows)

    def finish(self) -> LineScan:
        if self._line_start < self.size:  # a last line without its newline
            self._line_ends(self.size)
        if self._chunk_rows:
            self._close(self.size)
        return self

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return tuple(np.asarray(getattr(self, k), dtype=np.int64) for k in _KEYS)


def is_long_line(start: int, stop: int, rows: int) -> bool:
    """Whether a chunk is one line too long to read."""
    return rows == 1 and stop - start > MAX_LINE_BYTES


def long_line_reason(start: int, stop: int) -> str:
    return f"the line is {stop - start} bytes long, more than the {MAX_LINE_BYTES} bytes a line may have"


def _digest(arrays) -> str:
    return hashlib.sha256(b"".join(np.asarray(a, dtype="<i8").tobytes() for a in arrays)).hexdigest()


def to_payload(starts, stops, lines, rows) -> dict:
    arrays = (starts, stops, lines, rows)
    return {"chunk_bytes": CHUNK_BYTES, "max_line_bytes": MAX_LINE_BYTES, "digest": _digest(arrays),
            **{k: np.asarray(v, dtype=np.int64).tolist() for k, v in zip(_KEYS, arrays)}}


def from_payload(payload: dict, size: int | None) -> tuple[np.ndarray, ...] | None:
    """The four arrays of a saved index, or None unless they are the ones saved (their digest) and every value
    is one a scan of a file of ``size`` bytes (None: a decompressed stream of unknown size) could have given."""
    if not isinstance(payload, dict) or payload.get("chunk_bytes") != CHUNK_BYTES \
            or payload.get("max_line_bytes") != MAX_LINE_BYTES:
        return None
    lists = [payload.get(k) for k in _KEYS]
    if not all(isinstance(v, list) for v in lists) or len({len(v) for v in lists}) != 1:
        return None
    if not all(type(x) is int and 0 <= x <= _INT64_MAX for v in lists for x in v):
        return None
    starts, stops, lines, rows = arrays = tuple(np.asarray(v, dtype=np.int64).reshape(-1) for v in lists)
    if payload.get("digest") != _digest(arrays):
        return None
    n = starts.size
    if n == 0:
        return (starts, stops, lines, rows) if not size else None
    lengths = stops - starts
    ok = (starts[0] == 0 and (size is None or stops[-1] == size) and np.array_equal(starts[1:], stops[:-1])
          and lines[0] == 1 and np.array_equal(lines[1:], lines[:-1] + rows[:-1])
          and bool((rows >= 1).all()) and bool((rows <= lengths).all())
          and bool(((lengths < CHUNK_BYTES + MAX_LINE_BYTES) | (rows == 1)).all()))
    return (starts, stops, lines, rows) if ok else None
