"""A tabular source read chunk by chunk: what ``read(rows)`` needs is parsed when it is needed and kept in a
small cache, so memory is bounded by the cache, never by the files.

Opening only indexes the files (for text: a count of lines per chunk, cached beside each file; for Parquet:
its metadata), so ``len()`` is exact and the first batch comes at once. Rows are checked when their chunk is
read: a bad row raises ``RowError`` naming ``file:line``, or with ``OnError.SKIP`` is listed in ``skipped``
(once) and delivered as an invalid slot (``Rows.bad``), so no good row moves and every rank's batches keep
their size.
"""
from __future__ import annotations

import glob
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import numpy as np

from ...pipelines.on_error import OnError
from ...pipelines.tabular import Column, ColumnKind, TabularFiles
from ..errors import Skipped
from .tabular import ListColumn, MissingFileError, RowError, ScalarColumn, bad_row, check_rows


CHUNKS_BEYOND = 4  # chunks kept besides the cache's rows: those straddling the edges of what is being read


@dataclass
class ChunkIndex:
    """One file's chunks, in file order: where each starts and stops (bytes, or rows of its group), its first
    row's line (1-based; for Parquet the row), its rows, and its group (chunks of a group are read in order)."""

    starts: np.ndarray
    stops: np.ndarray
    lines: np.ndarray
    rows: np.ndarray
    groups: np.ndarray

    @classmethod
    def empty(cls) -> ChunkIndex:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z)


class RowsChunk(NamedTuple):
    """Every row of one chunk: its columns (bad rows hold zeros, missing), which rows are bad, and why. A
    format may give its scalar columns as blocks instead: ``ints`` [rows, integer columns] int64 (INT, HEX and
    STRING columns, in declared order), ``floats`` [rows, float columns] float64 (None: no float columns) and
    ``missing`` [rows, integer columns + float columns] bool; ``columns`` then holds only the list columns."""

    columns: dict
    bad: np.ndarray
    reasons: dict
    ints: np.ndarray | None = None
    missing: np.ndarray | None = None
    floats: np.ndarray | None = None


class _Packed(NamedTuple):
    """A chunk's scalar columns packed row-major by dtype, so gathering rows is one copy per dtype."""

    ints: np.ndarray     # [rows, integer columns] int64
    floats: np.ndarray   # [rows, float columns] float64
    missing: np.ndarray  # [rows, scalar columns] bool, integer columns first
    lists: dict          # name -> ListColumn
    bad: np.ndarray
    reasons: dict


class Rows(NamedTuple):
    columns: dict   # name -> ScalarColumn | ListColumn, one row per requested row
    bad: np.ndarray  # bool per requested row: a bad row skipped in its place


class ChunkFormat(Protocol):
    def index(self, path: str) -> ChunkIndex: ...

    def load(self, path: str, index: ChunkIndex, chunk: int) -> RowsChunk: ...


def expand(paths: tuple[str, ...]) -> list[str]:
    """Each path as given, or the files a glob pattern in it matches (sorted); a pattern matching nothing or a
    missing file is an error naming it."""
    out: list[str] = []
    for path in paths:
        if glob.has_magic(path):
            matched = sorted(glob.glob(path))
            if not matched:
                raise MissingFileError(path, None, "no file matches this pattern")
            out += matched
        elif not os.path.exists(path):
            raise MissingFileError(path)
        else:
            out.append(path)
    return out


@dataclass
class _Loading:
    done: threading.Event = field(default_factory=threading.Event)
    chunk: "_Packed | None" = None
    error: BaseException | None = None


class ChunkedTable:
    """An opened tabular source: ``num_rows`` rows over ``paths``, read by chunk through ``read(rows)``. Keeps
    at most ``cache_rows`` rows of parsed chunks, plus ``CHUNKS_BEYOND`` of the largest chunks."""

    def __init__(self, files: TabularFiles, reader: ChunkFormat, *, cache_rows: int):
        self.columns: tuple[Column, ...] = files.columns
        self.on_error = files.on_error
        self.skipped: list[Skipped] = []
        self.paths = expand(files.paths)
        self.reader = reader
        indexes, self.file_of, groups = [], [], []
        for f, path in enumerate(self.paths):
            index = reader.index(path)
            if not index.rows.size or not index.rows.sum():
                bad_row(self.on_error, self.skipped, path, None, "file is empty")
            indexes.append(index)
            self.file_of += [f] * index.rows.size
            # A chunk of group -1 stands alone (read on its own); others share their group within the file.
            groups += [(f, int(g)) if g >= 0 else (f, -1 - k) for k, g in enumerate(index.groups.tolist())]
        self.indexes = indexes
        self.file_of = np.asarray(self.file_of, dtype=np.int64)
        self.chunk_local = np.concatenate([np.arange(i.rows.size) for i in indexes] or [np.zeros(0, np.int64)])
        self.chunk_rows = np.concatenate([i.rows for i in indexes] or [np.zeros(0, np.int64)]).astype(np.int64)
        numbers: dict[tuple[int, int], int] = {}
        self.chunk_groups = np.asarray([numbers.setdefault(g, len(numbers)) for g in groups], dtype=np.int64)
        self.first_row = np.concatenate([[0], np.cumsum(self.chunk_rows)[:-1]]).astype(np.int64)
        self.num_rows = int(self.chunk_rows.sum())
        self.requested_cache_rows = cache_rows  # what open_source was given: another process opens it alike
        self.cache_rows = cache_rows + CHUNKS_BEYOND * int(self.chunk_rows.max(initial=0))
        if self.num_rows == 0:
            raise RowError(", ".join(self.paths), None, f"no rows ({len(self.skipped)} file(s) skipped)")
        self._ints = [c.name for c in self.columns if c.kind in (ColumnKind.INT, ColumnKind.HEX)]
        self._floats = [c.name for c in self.columns if c.kind is ColumnKind.FLOAT]
        self._lists = [c.name for c in self.columns if c.kind is ColumnKind.INT_LIST]
        self._cache: OrderedDict[int, _Packed] = OrderedDict()
        self._cached_rows = 0
        self._loading: dict[int, _Loading] = {}
        self._lock = threading.Lock()
        self._met_bad: set[int] = set()
        self.bytes_per_row = sum(_size(p) for p in self.paths) / self.num_rows

    def __len__(self) -> int:
        return self.num_rows

    def where(self, row: int) -> str:
        c = int(np.searchsorted(self.first_row, row, side="right") - 1)
        f = int(self.file_of[c])
        line = int(self.indexes[f].lines[self.chunk_local[c]] + row - self.first_row[c])
        return f"{self.paths[f]}:{line}"

    # ---- reading ----------------------------------------------------------------------------------
    def _load_missing(self, chunks: list[int]) -> None:
        """Parse, one at a time, the chunks of ``chunks`` that nobody has yet or is parsing: threads reading
        the same chunks (plans of one shuffle buffer-full) then share the parsing instead of waiting for each
        other's."""
        for c in chunks:
            with self._lock:
                if c in self._cache or c in self._loading:
                    continue
            self._chunk(c)

    def _chunk(self, c: int) -> _Packed:
        with self._lock:
            chunk = self._cache.get(c)
            if chunk is not None:
                self._cache.move_to_end(c)
                return chunk
            loading = self._loading.get(c)
            mine = loading is None
            if mine:
                loading = self._loading[c] = _Loading()
        if not mine:
            loading.done.wait()
            if loading.error is not None:
                raise loading.error
            return loading.chunk
        try:
            f = int(self.file_of[c])
            loading.chunk = self._pack(self.reader.load(self.paths[f], self.indexes[f], int(self.chunk_local[c])))
        except BaseException as exc:
            loading.error = exc
            raise
        finally:
            with self._lock:
                del self._loading[c]
                if loading.chunk is not None:
                    self._cache[c] = loading.chunk
                    self._cached_rows += int(self.chunk_rows[c])
                    while self._cached_rows > self.cache_rows and len(self._cache) > 1:
                        old, dropped = self._cache.popitem(last=False)
                        self._cached_rows -= int(self.chunk_rows[old])
            loading.done.set()
        return loading.chunk

    def _pack(self, chunk: RowsChunk) -> _Packed:
        n = chunk.bad.size
        if chunk.ints is not None:
            return _Packed(chunk.ints, np.zeros((n, 0), np.float64), chunk.missing, {}, chunk.bad, chunk.reasons)
        cols = chunk.columns
        ints = np.stack([cols[k].values for k in self._ints], axis=1) if self._ints else np.zeros((n, 0), np.int64)
        floats = np.stack([cols[k].values for k in self._floats], axis=1) if self._floats else \
            np.zeros((n, 0), np.float64)
        missing = np.stack([cols[k].missing for k in self._ints + self._floats], axis=1)
        return _Packed(ints.astype(np.int64, copy=False), floats.astype(np.float64, copy=False), missing,
                       {k: cols[k] for k in self._lists}, chunk.bad, chunk.reasons)

    def read(self, rows: np.ndarray) -> Rows:
        """The given rows (global numbers over all files, any order) and which of them are bad."""
        rows = check_rows(rows, self.num_rows)
        n = rows.size
        chunk_of = np.searchsorted(self.first_row, rows, side="right") - 1
        order = np.argsort(chunk_of, kind="stable")
        cuts = np.flatnonzero(np.diff(chunk_of[order])) + 1
        ints = np.empty((n, len(self._ints)), dtype=np.int64)
        floats = np.empty((n, len(self._floats)), dtype=np.float64)
        missing = np.empty((n, len(self._ints) + len(self._floats)), dtype=bool)
        bad = np.empty(n, dtype=bool)
        lists = {k: [] for k in self._lists}
        chunks = {}
        pieces = [piece for piece in np.split(order, cuts) if piece.size]
        needed = [int(chunk_of[piece[0]]) for piece in pieces]
        start = threading.get_ident() % max(len(needed), 1)  # threads start at different chunks
        self._load_missing(needed[start:] + needed[:start])
        for piece in pieces:  # the requested rows that one chunk holds
            c = int(chunk_of[piece[0]])
            chunks[c] = chunk = self._chunk(c)
            local = rows[piece] - self.first_row[c]
            ints[piece] = chunk.ints[local]
            floats[piece] = chunk.floats[local]
            missing[piece] = chunk.missing[local]
            bad[piece] = chunk.bad[local]
            for k in self._lists:
                lists[k].append((piece, take(chunk.lists[k], local)))
        columns = {}
        for j, k in enumerate(self._ints):
            columns[k] = ScalarColumn(ints[:, j], missing[:, j])
        for j, k in enumerate(self._floats):
            columns[k] = ScalarColumn(floats[:, j], missing[:, len(self._ints) + j])
        if self._lists:
            inverse = np.empty_like(order)
            inverse[order] = np.arange(n)
            for k in self._lists:
                columns[k] = take(concat([part for _, part in lists[k]]), inverse)
        for k in np.flatnonzero(bad).tolist():  # in the order the rows were asked for
            self._note_bad(int(rows[k]), chunks[int(chunk_of[k])], int(chunk_of[k]))
        return Rows({c.name: columns[c.name] for c in self.columns}, bad)

    def _note_bad(self, row: int, chunk: _Packed, c: int) -> None:
        """Raise for a bad row, or list it (once)."""
        with self._lock:
            if row in self._met_bad:
                return
            if self.on_error is OnError.SKIP:
                self._met_bad.add(row)
        f = int(self.file_of[c])
        local = row - int(self.first_row[c])
        line = int(self.indexes[f].lines[self.chunk_local[c]]) + local
        bad_row(self.on_error, self.skipped, self.paths[f], line, chunk.reasons[local])

    def chunks_in_memory(self) -> int:
        return len(self._cache)


def _size(path: str) -> int:
    """Bytes of a file, or of the files directly in a folder (a converted table)."""
    if os.path.isdir(path):
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    return os.path.getsize(path)


def take(col, rows: np.ndarray):
    if isinstance(col, ScalarColumn):
        return ScalarColumn(col.values[rows], col.missing[rows])
    lengths = (col.offsets[1:] - col.offsets[:-1])[rows]
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = np.repeat(col.offsets[:-1][rows] - offsets[:-1], lengths)
    return ListColumn(offsets, col.values[starts + np.arange(offsets[-1])])


def concat(parts: list):
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], ScalarColumn):
        return ScalarColumn(np.concatenate([p.values for p in parts]), np.concatenate([p.missing for p in parts]))
    shifts = np.cumsum([0] + [p.offsets[-1] for p in parts[:-1]])
    offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shifts)])
    return ListColumn(offsets.astype(np.int64), np.concatenate([p.values for p in parts]))
