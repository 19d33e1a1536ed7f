"""Rows of TSV files (plain or gzip) by row number.

Opening indexes each file once: plain files are memory-mapped, gzip files are decompressed into memory once,
and the start and end of every line are found with NumPy. Every line is parsed and checked at that time (in
chunks, with the same vectorised parser as reads), so bad lines raise or are skipped before the first batch
and ``num_rows`` counts good lines only. ``read`` then gathers the requested lines' bytes and parses them.
"""
from __future__ import annotations

import gzip
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..pipelines.tabular import OnError, TabularFiles
from .tabular_io import MissingFileError, RowError, ScalarColumn, SkippedRow, check_rows
from .tsv_parse import PAD, join_lines, parse_lines

GZIP_MAGIC = b"\x1f\x8b"
SCAN_BYTES = 1 << 22
CHECK_LINES = 1 << 13  # a chunk's bytes (~2 MB for Criteo) stay in cache while it is parsed


class TsvSource:
    def __init__(self, files: TabularFiles):
        self.columns = files.columns
        self.on_error = files.on_error
        self.skipped: list[SkippedRow] = []
        self._paths = files.paths
        self._buffers: list[np.ndarray] = []
        starts, ends, file_ids = [], [], []
        for f, path in enumerate(files.paths):
            buf = _load(path)
            if buf is None:
                self._bad(path, None, "file is empty")
                buf = np.zeros(0, dtype=np.uint8)
            start, end = _line_bounds(buf)
            good = self._check(path, buf, start, end)
            starts.append(start[good])
            ends.append(end[good])
            file_ids.append(np.full(int(good.sum()), f, dtype=np.int32))
            self._buffers.append(buf)
        self._start = np.concatenate(starts)
        self._end = np.concatenate(ends)
        self._file = np.concatenate(file_ids)
        self.num_rows = int(self._start.size)
        if self.num_rows == 0:
            raise RowError(", ".join(files.paths), None, f"no good rows ({len(self.skipped)} skipped)")

    def _bad(self, path: str, line: int | None, reason: str) -> None:
        if self.on_error is OnError.RAISE:
            raise RowError(path, line, reason)
        self.skipped.append(SkippedRow(path, line, reason))

    def _check(self, path: str, buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Which lines parse; the others raise or are recorded as skipped, in line order. Chunks are checked
        on several threads (NumPy releases the GIL)."""
        good = np.ones(start.size, dtype=bool)
        chunks = range(0, start.size, CHECK_LINES)
        pool = ThreadPoolExecutor(_threads(), thread_name_prefix="feedline-tsv-check")
        try:
            for found in pool.map(lambda a: self._bad_lines(buf, start, end, a), chunks):
                for line, reason in found:
                    self._bad(path, line + 1, reason)
                    good[line] = False
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return good

    def _bad_lines(self, buf: np.ndarray, start: np.ndarray, end: np.ndarray, a: int) -> list[tuple[int, str]]:
        b = min(start.size, a + CHECK_LINES)
        lo, hi = int(start[a]), int(end[b - 1])
        lines = np.empty(PAD + hi - lo + 1, dtype=np.uint8)
        lines[:PAD] = ord("0")
        lines[PAD:-1] = buf[lo:hi]
        lines[-1] = ord("\n")
        parsed = parse_lines(lines, b - a, self.columns, convert=False)
        return [(a + i, parsed.reason(i)) for i in np.flatnonzero(parsed.bad).tolist()]

    def read(self, rows: np.ndarray) -> dict[str, ScalarColumn]:
        rows = check_rows(rows, self.num_rows)
        start, end, file = self._start[rows], self._end[rows], self._file[rows]
        # Rows that follow each other in a file are copied as one piece (a whole batch, when not shuffled).
        cut = np.flatnonzero((start[1:] != end[:-1] + 1) | (file[1:] != file[:-1])) + 1
        first, last = np.concatenate([[0], cut]), np.concatenate([cut, [rows.size]]) - 1
        starts, ends, files = start[first].tolist(), end[last].tolist(), file[first].tolist()
        # Slicing NumPy arrays is several times faster than slicing memoryviews; join copies each piece once.
        if len(self._buffers) == 1:
            buf = self._buffers[0]
            pieces = [buf[s:e] for s, e in zip(starts, ends)]
        else:
            bufs = self._buffers
            pieces = [bufs[f][s:e] for f, s, e in zip(files, starts, ends)]
        parsed = parse_lines(join_lines(pieces), rows.size, self.columns, check=False)
        if parsed.bad.any():
            i = int(np.flatnonzero(parsed.bad)[0])
            f = int(self._file[rows[i]])
            raise RowError(self._paths[f], None, f"changed since it was opened: a line that parsed then now fails "
                                                 f"({parsed.reason(i)})")
        return {c.name: ScalarColumn(parsed.values[c.name], parsed.missing[c.name]) for c in self.columns}


def _load(path: str) -> np.ndarray | None:
    """The file's bytes (gzip decompressed), or None for an empty file."""
    if not os.path.isfile(path):
        raise MissingFileError(path)
    with open(path, "rb") as f:
        magic = f.read(2)
        if magic == GZIP_MAGIC:
            f.seek(0)
            try:
                data = gzip.decompress(f.read())
            except (OSError, EOFError) as e:
                raise RowError(path, None, f"is not a readable gzip file: {e}") from None
            return np.frombuffer(data, dtype=np.uint8) if data else None
    if not magic:
        return None
    with open(path, "rb") as f:
        # MAP_POPULATE maps every page up front: reads then never stop on page faults.
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
    return np.frombuffer(mapped, dtype=np.uint8)


def _line_bounds(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every line; a last line needs no newline."""
    with ThreadPoolExecutor(_threads(), thread_name_prefix="feedline-tsv-index") as pool:
        newlines = list(pool.map(lambda o: np.flatnonzero(buf[o:o + SCAN_BYTES] == 0x0A) + o,
                                 range(0, buf.size, SCAN_BYTES)))
    end = np.concatenate([*newlines, np.zeros(0, dtype=np.int64)]).astype(np.int64)
    if buf.size and buf[-1] != 0x0A:
        end = np.append(end, buf.size)
    start = np.empty_like(end)
    start[:1] = 0
    start[1:] = end[:-1] + 1
    return start, end


def _threads() -> int:
    try:
        return max(1, min(8, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(8, os.cpu_count() or 1))
