"""Rows of TSV files (plain or gzip) by row number.

Opening reads each file once: plain files are memory-mapped, gzip files are decompressed into memory, the
start and end of every line are found with NumPy, and every line is parsed (in chunks, on several threads, with
the vectorised parser of ``tsv_parse``) and checked, so bad lines raise or are skipped before the first batch
and ``num_rows`` counts good lines only. The parsed columns are kept, each in the narrowest integer type that
holds its values (for Criteo that is smaller than the text), and the file's bytes are let go: like Parquet,
``read`` is then a gather, and the text is parsed once, not once at opening and again every epoch.
"""
from __future__ import annotations

import gzip
import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..devices import available_cores
from ...pipelines.tabular import TabularFiles
from ..errors import Skipped
from .tabular import bad_row, MissingFileError, RowError, ScalarColumn, check_rows
from .tsv_parse import PAD, parse_lines

GZIP_MAGIC = b"\x1f\x8b"
SCAN_BYTES = 1 << 22
CHECK_LINES = 1 << 13  # a chunk's bytes (~2 MB for Criteo) stay in cache while it is parsed


class TsvSource:
    def __init__(self, files: TabularFiles):
        self.columns = files.columns
        self.on_error = files.on_error
        self.skipped: list[Skipped] = []
        self._paths = files.paths
        # Columns are kept row-major, one block per column kind (a row's fields lie together, so gathering the
        # rows of a shuffled batch touches one or two cache lines per row, not one per field).
        self._kinds = tuple(dict.fromkeys(c.kind for c in self.columns))
        self._index = {kind: [j for j, c in enumerate(self.columns) if c.kind is kind] for kind in self._kinds}
        parts: list[tuple[list, np.ndarray]] = []  # per file: values block per kind, packed missing bits
        for path in files.paths:
            buf = _load(path)
            if buf is None:
                self._bad(path, None, "file is empty")
                continue
            parts.append(self._parse_file(path, buf))
            del buf  # the text is not needed once parsed (a memory map closes with its last reference)
        self._blocks = [_concat([p[0][k] for p in parts], (0, len(self._index[kind])))
                        for k, kind in enumerate(self._kinds)]
        self._missing = _concat([p[1] for p in parts], (0, -(-len(self.columns) // 8)), np.uint8)
        self.num_rows = int(self._missing.shape[0])
        if self.num_rows == 0:
            raise RowError(", ".join(files.paths), None, f"no good rows ({len(self.skipped)} skipped)")

    def __len__(self) -> int:
        return self.num_rows

    def _bad(self, path: str, line: int | None, reason: str) -> None:
        bad_row(self.on_error, self.skipped, path, line, reason)

    def _parse_file(self, path: str, buf: np.ndarray) -> tuple[list, np.ndarray]:
        """Every good line's values (a block per kind) and missing bits, parsed in chunks on several threads
        (NumPy releases the GIL); bad lines raise or are recorded as skipped, in line order."""
        start, end = _line_bounds(buf)
        chunks = range(0, start.size, CHECK_LINES)
        blocks: list[list] = [[] for _ in self._kinds]
        missing: list[np.ndarray] = []
        pool = ThreadPoolExecutor(_threads(), thread_name_prefix="feedline-tsv-parse")
        try:
            for found, values, miss in pool.map(lambda a: self._parse_chunk(buf, start, end, a), chunks):
                for line, reason in found:
                    self._bad(path, line + 1, reason)
                for k, v in enumerate(values):
                    blocks[k].append(v)
                missing.append(miss)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return ([_concat(b, (0, len(self._index[kind]))) for b, kind in zip(blocks, self._kinds)],
                _concat(missing, (0, -(-len(self.columns) // 8)), np.uint8))

    def _parse_chunk(self, buf: np.ndarray, start: np.ndarray, end: np.ndarray, a: int):
        b = min(start.size, a + CHECK_LINES)
        lo, hi = int(start[a]), int(end[b - 1])
        lines = np.empty(PAD + hi - lo + 1, dtype=np.uint8)
        lines[:PAD] = ord("0")
        lines[PAD:-1] = buf[lo:hi]
        lines[-1] = ord("\n")
        parsed = parse_lines(lines, b - a, self.columns, by_row=True)
        bad = np.flatnonzero(parsed.bad)
        found = [(a + i, parsed.reason(i)) for i in bad.tolist()]
        if not parsed.lines.size:  # no line of the chunk had the right field count
            return (found, [np.zeros((0, len(self._index[kind])), dtype=np.uint8) for kind in self._kinds],
                    np.zeros((0, -(-len(self.columns) // 8)), dtype=np.uint8))
        keep = np.flatnonzero(~parsed.bad[parsed.lines]) if bad.size else slice(None)  # good well-split lines
        values = [_narrow(parsed.blocks[kind][keep]) for kind in self._kinds]
        missing = np.empty((values[0].shape[0], len(self.columns)), dtype=bool)
        for kind in self._kinds:
            idx = self._index[kind]
            missing[:, slice(idx[0], idx[-1] + 1) if _contiguous(idx) else idx] = parsed.empty[kind][keep]
        return found, values, np.packbits(missing, axis=1, bitorder="little")

    def read(self, rows: np.ndarray) -> dict[str, ScalarColumn]:
        rows = check_rows(rows, self.num_rows)
        missing = np.unpackbits(self._missing.take(rows, axis=0), axis=1, count=len(self.columns),
                                bitorder="little").view(bool).T
        out = {}
        for kind, block in zip(self._kinds, self._blocks):
            values = np.ascontiguousarray(block.take(rows, axis=0).T, dtype=np.int64)
            for k, j in enumerate(self._index[kind]):
                out[self.columns[j].name] = ScalarColumn(values[k], missing[j])
        return {c.name: out[c.name] for c in self.columns}


def _contiguous(idx: list[int]) -> bool:
    return idx == list(range(idx[0], idx[-1] + 1))


# Narrow types that NumPy's concatenation promotes among without ever reaching float64 (no uint64).
_NARROW = tuple((np.dtype(t), np.iinfo(t).min, np.iinfo(t).max)
                for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32))


def _narrow(v: np.ndarray) -> np.ndarray:
    """``v`` (int64) in the smallest integer type that holds all its values exactly."""
    if not v.size:
        return v.astype(np.uint8)
    low, high = int(v.min()), int(v.max())
    for dtype, lo, hi in _NARROW:
        if lo <= low and high <= hi:
            return v.astype(dtype)
    return v


def _concat(arrays: list, empty_shape: tuple, empty_dtype=np.uint8) -> np.ndarray:
    if not arrays:
        return np.zeros(empty_shape, dtype=empty_dtype)
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


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
    return min(8, available_cores())
