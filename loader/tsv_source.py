"""Rows of TSV files (plain or gzip) by row number.

Opening indexes each file once: plain files are memory-mapped, gzip files are decompressed into memory once,
and the start and end of every line are found with NumPy. Every line is parsed and checked at that time (in
chunks, with the same vectorised parser as reads), so bad lines raise or are skipped before the first batch
and ``num_rows`` counts good lines only. ``read`` then gathers the requested lines' bytes and parses them.
"""
from __future__ import annotations

import gzip
import os

import numpy as np

from ..pipelines.tabular import OnError, TabularFiles
from .tabular_io import MissingFileError, RowError, ScalarColumn, SkippedRow, check_rows
from .tsv_parse import PAD, join_lines, parse_lines

GZIP_MAGIC = b"\x1f\x8b"
SCAN_BYTES = 1 << 26
CHECK_LINES = 1 << 17


class TsvSource:
    def __init__(self, files: TabularFiles):
        self.columns = files.columns
        self.on_error = files.on_error
        self.skipped: list[SkippedRow] = []
        self._paths = files.paths
        self._views: list[memoryview] = []
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
            self._views.append(memoryview(buf))
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
        """Which lines parse; the others raise or are recorded as skipped."""
        good = np.ones(start.size, dtype=bool)
        for a in range(0, start.size, CHECK_LINES):
            b = min(start.size, a + CHECK_LINES)
            lo, hi = int(start[a]), int(end[b - 1])
            lines = np.empty(PAD + hi - lo + 1, dtype=np.uint8)
            lines[:PAD] = ord("0")
            lines[PAD:-1] = buf[lo:hi]
            lines[-1] = ord("\n")
            parsed = parse_lines(lines, b - a, self.columns)
            for i in np.flatnonzero(parsed.bad).tolist():
                self._bad(path, a + i + 1, parsed.reason(i))
                good[a + i] = False
        return good

    def read(self, rows: np.ndarray) -> dict[str, ScalarColumn]:
        rows = check_rows(rows, self.num_rows)
        starts, ends = self._start[rows].tolist(), self._end[rows].tolist()
        if len(self._views) == 1:
            view = self._views[0]
            pieces = [view[s:e] for s, e in zip(starts, ends)]
        else:
            views = self._views
            pieces = [views[f][s:e] for f, s, e in zip(self._file[rows].tolist(), starts, ends)]
        parsed = parse_lines(join_lines(pieces), rows.size, self.columns)
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
    return np.memmap(path, dtype=np.uint8, mode="r")


def _line_bounds(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without the newline) of every line; a last line needs no newline."""
    newlines = [np.flatnonzero(buf[o:o + SCAN_BYTES] == 0x0A) + o for o in range(0, buf.size, SCAN_BYTES)]
    end = np.concatenate([*newlines, np.zeros(0, dtype=np.int64)]).astype(np.int64)
    if buf.size and buf[-1] != 0x0A:
        end = np.append(end, buf.size)
    start = np.empty_like(end)
    start[:1] = 0
    start[1:] = end[:-1] + 1
    return start, end
