"""A tabular source read chunk by chunk: what ``read(rows)`` needs is parsed when it is needed and kept in a
small cache, so memory is bounded by the cache, never by the files.

Opening only indexes the files (for text: a count of lines per chunk, cached beside each file; for Parquet:
its metadata), so ``len()`` is exact and the first batch comes at once. Rows are checked when their chunk is
read: a bad row raises ``RowError`` naming ``file:line``, or with ``OnError.SKIP`` is listed in ``skipped``
(once) and delivered as an invalid slot (``Rows.bad``), so no good row moves and every rank's batches keep
their size.

A cached chunk keeps its scalar columns as one ``ops.ColumnBlock`` (a parsed block as it came, or a converted
table's chunk as it was read from disk), so ``gather`` writes a batch's rows straight from the cache into the
batch's arrays, no per-column arrays in between: one native call over all the chunks the batch touches where they
are row records (a converted table's, or a text table's kept by its table cache: ``ops.gather_columns.gather_table``
finds them by number, ``gather_blocks`` takes them grouped), else one per chunk.
"""
from __future__ import annotations

import glob
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, NamedTuple, Protocol

import numpy as np

from ... import ops
from ...ops.gather_columns import gather_blocks, gather_table, touched_chunks
from ...pipelines.own_files import is_own_file
from ...pipelines.tabular import Column, ColumnKind, TabularFiles
from ..errors import Skipped
from ..skip_log import SkipLog
from .chunk_cache import ChunkCache, PackedChunk
from .table_rows import ListColumn, MissingFileError, RowError, Rows, ScalarColumn, bad_row, check_rows

# Chunks kept besides the cache's rows (two shuffle buffer-fulls: the one being gathered and the one being warmed):
# those straddling the edges of the buffer-fulls, and the first shares of the buffer-full after next, which warming
# reads while the last plan of the one being gathered may still wait to be made.
CHUNKS_BEYOND = 6


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


class Gathered(NamedTuple):
    """What ``gather`` gives besides the arrays it wrote: which rows are bad, and the list columns asked for."""

    bad: np.ndarray
    lists: dict


class ChunkFormat(Protocol):
    def index(self, path: str) -> ChunkIndex: ...

    def load(self, path: str, index: ChunkIndex, chunk: int) -> RowsChunk: ...

    # A format whose chunks hold only good scalar rows may give them as a block instead, read without parsing
    # (its columns: the integer ones, then the float ones, in declared order):
    # def load_block(self, path: str, index: ChunkIndex, chunk: int) -> ops.ColumnBlock: ...


def expand(paths: tuple[str, ...]) -> list[str]:
    """Each path as given, or the files a glob pattern in it matches (sorted); a pattern matching nothing or a
    missing file is an error naming it. The files feedline writes beside data (indexes, their temporary files)
    are never taken for data: a pattern leaves them out, and naming one is an error."""
    out: list[str] = []
    for path in paths:
        if glob.has_magic(path):
            found = glob.glob(path)
            matched = sorted(p for p in found if not is_own_file(p))
            if not matched:
                raise MissingFileError(path, None, "no file matches this pattern" if not found else
                                       "no file matches this pattern but feedline's own index files")
            out += matched
        elif not os.path.exists(path):
            raise MissingFileError(path)
        elif is_own_file(path):
            raise RowError(path, None, "is an index file that feedline wrote beside the data, not data")
        else:
            out.append(path)
    return out


class ChunkedTable:
    """An opened tabular source: ``num_rows`` rows over ``paths``, read by chunk through ``read(rows)``. Keeps
    at most ``cache_rows`` rows of parsed chunks, plus ``CHUNKS_BEYOND`` of the largest chunks."""

    def __init__(self, files: TabularFiles, reader: ChunkFormat, *, cache_rows: int, skips: SkipLog | None = None,
                 lazy_index: bool = False):
        """``lazy_index``: a single gzip file whose index is not remembered may be indexed on a thread while its
        first rows are read (``growing``; see ``wait_rows``); the caller then reads only rows below
        ``num_rows`` (the rows indexed so far) until ``pending`` is False."""
        self.columns: tuple[Column, ...] = files.columns
        self.on_error = files.on_error
        self.skips = SkipLog() if skips is None else skips  # bad rows and files met (``skipped``)
        self.paths = expand(files.paths)
        self.reader = reader
        self.requested_cache_rows = cache_rows  # what open_source was given: another process opens it alike
        self._cache: ChunkCache | None = None
        self._lock = threading.Lock()
        self._file_bytes = sum(_size(p) for p in self.paths)
        self.growing = None  # the index being built (``growing_index.GrowingIndex``), or None
        if lazy_index and len(self.paths) == 1 and hasattr(reader, "index_lazily") \
                and not getattr(reader, "header", False):
            self.growing = reader.index_lazily(self.paths[0], self._published, self._completed)
        if self.growing is None:
            indexes = []
            for path in self.paths:
                index = reader.index(path)
                if not index.rows.size or not index.rows.sum():
                    bad_row(self.on_error, self.skips, path, None, "file is empty")
                indexes.append(index)
            self._set_index(indexes)
        else:
            # The first buffer-full indexed (or the whole file, if shorter), so that readers plan with it.
            _, complete = self.growing.wait_rows(max(cache_rows // 2, 1))
            if complete and not self.num_rows:
                bad_row(self.on_error, self.skips, self.paths[0], None, "file is empty")
        self.bytes_per_row = self._file_bytes / max(self.estimate_rows(), 1)
        if self.num_rows == 0:
            raise RowError(", ".join(self.paths), None, f"no rows ({len(self.skipped)} file(s) skipped)")
        self._floats = [c.name for c in self.columns if c.kind is ColumnKind.FLOAT]
        self._lists = [c.name for c in self.columns if c.kind is ColumnKind.INT_LIST]
        self._ints = [c.name for c in self.columns if c.name not in self._floats and c.name not in self._lists]
        self.picks = ColumnPicks(self._ints + self._floats)  # picks(label, dense, categorical)
        self._prepared: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._by_address = True  # whether ``gather`` tries the cached chunks by address first
        self.uncached_gathers = 0  # gathers by address that fell back to grouping: a chunk was not cached (-1)
        # Bytes a cached row takes (what a gather reads from): a format's own, else parsed blocks' (an int64 or
        # float64 value and a missing flag per scalar column).
        scalars = len(self._ints) + len(self._floats)
        sizes = [getattr(reader, "cached_row_bytes", lambda path: None)(p) for p in self.paths]
        self.cached_row_bytes = max((s if s is not None else 9.0 * scalars for s in sizes), default=9.0 * scalars)

    def _set_index(self, indexes: list[ChunkIndex]) -> None:
        """The table's chunks from its files' indexes (again each time a lazily built index grows: the arrays are
        replaced, never changed in place; ``num_rows`` last)."""
        arrays = chunk_arrays(indexes)
        cache_rows = self.requested_cache_rows + CHUNKS_BEYOND * int(arrays.chunk_rows.max(initial=0))
        if self._cache is None:
            self._cache = ChunkCache(arrays.chunk_rows, cache_rows, reads_into=hasattr(self.reader, "load_block"))
        else:
            self._cache.grow(arrays.chunk_rows, cache_rows)
        self.indexes = list(indexes)
        self.cache_rows = cache_rows
        for name, value in arrays._asdict().items():  # num_rows last
            setattr(self, name, value)

    # ---- a gzip file indexed while it is read (``lazy_index``) --------------------------------------
    def _published(self, index: ChunkIndex, complete: bool) -> None:
        self._set_index([index])  # (the scan's thread: more of the file's chunks closed; all when ``complete``)

    def _completed(self, index: ChunkIndex) -> None:
        """(The scan's thread, the index complete and kept.)"""
        self.bytes_per_row = self._file_bytes / max(self.num_rows, 1)

    @property
    def pending(self) -> bool:
        """Whether the table's index is still being built (``num_rows`` then counts the rows indexed so far)."""
        return self.growing is not None and not self.growing.complete

    def wait_rows(self, rows: int) -> tuple[int, bool]:
        """Until at least ``rows`` rows are indexed or the index is complete: ``(num_rows, complete)``. Raises
        the error the index's scan met (naming the file)."""
        if self.growing is None:
            return self.num_rows, True
        return self.growing.wait_rows(rows)

    def estimate_rows(self) -> int:
        """The table's rows: ``num_rows`` once the index is complete, else an estimate from the compressed bytes
        indexed so far."""
        return self.num_rows if self.growing is None else self.growing.estimate_rows()

    def __len__(self) -> int:
        """Rows: exact, so while ``pending`` it waits for the index (``num_rows`` counts the rows indexed so far)."""
        return self.wait_rows(1 << 62)[0] if self.pending else self.num_rows

    def where(self, row: int) -> str:
        c = int(np.searchsorted(self.first_row, row, side="right") - 1)
        f = int(self.file_of[c])
        line = int(self.indexes[f].lines[self.chunk_local[c]] + row - self.first_row[c])
        return f"{self.paths[f]}:{line}"

    # ---- reading ----------------------------------------------------------------------------------
    def _load(self, c: int) -> PackedChunk:
        """Chunk ``c`` read and parsed (not cached)."""
        f = int(self.file_of[c])
        if hasattr(self.reader, "load_block"):
            block = self.reader.load_block(self.paths[f], self.indexes[f], int(self.chunk_local[c]), self._cache.spare)
            return PackedChunk(block, {}, np.zeros(block.rows, dtype=bool), {}, False)
        if hasattr(self.reader, "load_packed"):  # parsed, or read back as it was kept (``table_cache``)
            return self.reader.load_packed(self.paths[f], self.indexes[f], int(self.chunk_local[c]), self._pack)
        return self._pack(self.reader.load(self.paths[f], self.indexes[f], int(self.chunk_local[c])))

    def load_raw(self, c: int) -> tuple[PackedChunk, bool]:
        """Chunk ``c`` as ``gather`` reads it, and whether the caller owns it: the cached chunk (not owned), else
        one read for the caller alone (hand it to ``release_raw`` when done, so that its buffer is read into again)."""
        chunk = self._cache.cached(c)
        if chunk is not None:
            return chunk, False
        return self._load(c), True

    def warm(self, chunks: list[int]) -> None:
        """The chunks of ``chunks`` that nobody holds or reads, read into the cache now, ahead of the batches that
        need them; those cached already are made the most lately used. So the cache keeps chunks in the order the
        coming batches need them and drops first those of a finished buffer-full (a gather by address touches
        nothing, or the chunks gathered again and again would outlive those warmed next). A chunk that fails is
        left for the batch that needs it to meet the error."""
        self._cache.touch(chunks)
        try:
            self._cache.load_missing(chunks, self._load)
        except Exception:
            pass

    def release_raw(self, chunk: PackedChunk) -> None:
        """An owned chunk of ``load_raw`` that nothing reads any more: its buffer is read into again."""
        self._cache.release(chunk)

    def gather_chunk(self, chunk: PackedChunk, start: int, stop: int, *, label: str | None, dense: tuple[str, ...],
                     categorical: tuple[str, ...], missing_id: int, label_out: np.ndarray | None = None,
                     dense_out: np.ndarray | None = None, ids_out: np.ndarray | None = None) -> None:
        """Rows ``start..stop`` of a chunk of ``load_raw``, in order, written as ``gather`` writes rows."""
        local = np.arange(start, stop, dtype=np.int64)
        ops.gather_columns(chunk.block, self.picks(label, dense, categorical), local, local - start,
                           missing_id=missing_id, label=label_out, dense=dense_out, ids=ids_out)

    @property
    def prepared_rows(self):
        """``_prepared_rows``, where the table's chunks are known (not while its index is built: its blocks are
        sized by the chunk count; a runner made meanwhile gathers raw rows)."""
        if self.pending:
            raise AttributeError("prepared_rows: the table's index is still being built")
        return self._prepared_rows

    def _prepared_rows(self, key, layout: ops.RowLayout, prepare, *, read_stage: str):
        """The table's rows in finished form (``PreparedRows``), shared by everybody asking with an equal
        ``key`` while any of them holds it."""
        from .prepared import PreparedRows

        with self._lock:
            rows = self._prepared.get(key)
            if rows is None:
                rows = PreparedRows(self, layout, prepare, read_stage=read_stage)
                self._prepared[key] = rows
        return rows

    def _pack(self, chunk: RowsChunk) -> PackedChunk:
        return pack_chunk(chunk, self._ints, self._floats, self._lists)

    def _groups(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``rows`` by chunk (``ops.group_by_chunk``), with the chunks nobody holds yet parsed first; threads
        start at different chunks so that those reading one buffer-full share the parsing."""
        chunks, bounds, local, positions = ops.group_by_chunk(rows, self.first_row, self.num_rows)
        needed = chunks.tolist()
        start = threading.get_ident() % max(len(needed), 1)
        self._cache.load_missing(needed[start:] + needed[:start], self._load)
        return chunks, bounds, local, positions

    def read(self, rows: np.ndarray) -> Rows:
        """The given rows (global numbers over all files, any order) and which of them are bad."""
        rows = check_rows(rows, self.num_rows)
        n = rows.size
        ints = np.empty((n, len(self._ints)), dtype=np.int64)
        floats = np.empty((n, len(self._floats)), dtype=np.float64)
        missing = np.empty((n, len(self._ints) + len(self._floats)), dtype=bool)
        int_columns = np.arange(len(self._ints), dtype=np.int64)
        float_columns = np.arange(len(self._ints), len(self._ints) + len(self._floats), dtype=np.int64)

        def put(block, here, at):
            ints[at], floats[at], missing[at] = ops.gather_raw(block, int_columns, float_columns, here)

        bad, columns = self._by_chunk(rows, self._lists, put)
        for j, k in enumerate(self._ints):
            columns[k] = ScalarColumn(ints[:, j], missing[:, j])
        for j, k in enumerate(self._floats):
            columns[k] = ScalarColumn(floats[:, j], missing[:, len(self._ints) + j])
        return Rows({c.name: columns[c.name] for c in self.columns}, bad)

    def gather(self, rows: np.ndarray, *, label: str | None, dense: tuple[str, ...], categorical: tuple[str, ...],
               lists: tuple[str, ...] = (), missing_id: int, label_out: np.ndarray | None = None,
               dense_out: np.ndarray | None = None, ids_out: np.ndarray | None = None) -> Gathered:
        """The given rows written into a batch's arrays, position ``i`` of each for ``rows[i]``: ``label`` into
        ``label_out`` (float32 [n]), the ``dense`` columns into the rows of ``dense_out`` (float32 [D, n], NaN
        where missing), the ``categorical`` ones into ``ids_out`` (int64 [K, n], ``missing_id`` where missing);
        the ``lists`` columns are returned, with which rows are bad."""
        if not (isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1):
            rows = check_rows(rows, self.num_rows)  # (the range is checked with the grouping)
        rows = np.ascontiguousarray(rows)
        picks = self.picks(label, dense, categorical)
        if not lists and self._by_address:
            got = _gather_cached(self, rows, picks, missing_id, label_out, dense_out, ids_out)
            if got is not None and got >= 0:
                return Gathered(_no_bad_rows(rows.size), {})
            self.uncached_gathers += got == -1  # (a figure: an increment lost to a race costs nothing)
            self._by_address = got != -3  # -3: never laid out for it, not asked again

        def put(block, here, at):
            ops.gather_columns(block, picks, here, at, missing_id=missing_id, label=label_out, dense=dense_out,
                               ids=ids_out)

        def put_all(blocks, bounds, local, positions):
            return gather_blocks(blocks, picks, bounds, local, positions, missing_id=missing_id, label=label_out,
                                 dense=dense_out, ids=ids_out)

        return Gathered(*self._by_chunk(rows, lists, put, put_all))

    def _by_chunk(self, rows: np.ndarray, lists, put: Callable, put_all: Callable | None = None
                  ) -> tuple[np.ndarray, dict]:
        """``put(block, here, at)`` for each chunk holding some of ``rows`` (``here``: those rows within the
        chunk, ``at``: their positions in ``rows``), or ``put_all(blocks, bounds, local, positions)`` once for
        all of them where it can (it returns whether it did); then which rows are bad (each noted, in the order
        the rows were asked for) and the ``lists`` columns at ``rows``."""
        chunks, bounds, local, positions = self._groups(rows)
        numbers = chunks.tolist()
        # Every chunk is held here until it has been gathered: a converted chunk evicted meanwhile (by the next
        # ones read) keeps its buffer, which ``ChunkCache.spare`` gives out only once nothing holds it.
        held = self._cache.get_all(numbers, self._load)
        if put_all is None or not put_all([chunk.block for chunk in held], bounds, local, positions):
            for g, chunk in enumerate(held):
                put(chunk.block, local[bounds[g]:bounds[g + 1]], positions[bounds[g]:bounds[g + 1]])
        return bad_rows_and_lists(self, rows, numbers, held, (bounds, local, positions), lists)

    @property
    def skipped(self) -> list[Skipped]:
        """The bad rows and files met so far with ``OnError.SKIP``, once each, in the order met."""
        return self.skips.skipped

    def note_bad(self, row: int, chunk: PackedChunk, c: int) -> None:
        """Raise for a bad row, or list it (once)."""
        f = int(self.file_of[c])
        local = row - int(self.first_row[c])
        line = int(self.indexes[f].lines[self.chunk_local[c]]) + local
        bad_row(self.on_error, self.skips, self.paths[f], line, chunk.reasons[local])


def bad_rows_and_lists(table: ChunkedTable, rows: np.ndarray, numbers: list[int], held: list[PackedChunk],
                       groups: tuple, lists) -> tuple[np.ndarray, dict]:
    """Which of ``rows`` are bad (each noted by ``table.note_bad``, in the order the rows were asked for) and the
    ``lists`` columns at ``rows``: group ``g`` of ``groups`` (``bounds, local, positions`` as
    ``ops.group_by_chunk`` gives them) is chunk ``numbers[g]``, ``held[g]``."""
    bounds, local, positions = groups
    bad = np.zeros(rows.size, dtype=bool)
    bads: list[tuple[int, PackedChunk, int]] = []
    parts: dict[str, list] = {k: [] for k in lists}
    for g, (c, chunk) in enumerate(zip(numbers, held)):
        if not (chunk.any_bad or lists):
            continue
        here, at = local[bounds[g]:bounds[g + 1]], positions[bounds[g]:bounds[g + 1]]
        if chunk.any_bad:
            bad[at] = chunk.bad[here]
            bads += [(k, chunk, c) for k in at[chunk.bad[here]].tolist()]
        for k in lists:
            parts[k].append(take(chunk.lists[k], here))
    out: dict = {}
    if lists:
        inverse = np.empty_like(positions)
        inverse[positions] = np.arange(rows.size)
        out = {k: take(concat(parts[k]), inverse) for k in lists}
    for k, chunk, c in sorted(bads, key=lambda bad: bad[0]):
        table.note_bad(int(rows[k]), chunk, c)
    return bad, out


class ColumnPicks:
    """``ops.gather_columns``' picks of named columns of a chunk's block (whose columns are ``names``), made once
    for each choice of columns: ``picks(label, dense, categorical)``."""

    def __init__(self, names: list[str]):
        self._where = {name: j for j, name in enumerate(names)}
        self._made: dict[tuple, np.ndarray] = {}

    def __call__(self, label: str | None, dense: tuple[str, ...], categorical: tuple[str, ...]) -> np.ndarray:
        picks = self._made.get((label, dense, categorical))
        if picks is None:
            where = self._where
            picks = self._made[(label, dense, categorical)] = ops.gather_picks(
                None if label is None else where[label], [where[k] for k in dense], [where[k] for k in categorical])
        return picks


def pack_chunk(chunk: RowsChunk, int_names: list[str], float_names: list[str], list_names: list[str]) -> PackedChunk:
    """A parsed chunk as the table keeps it: its scalar columns in one row-major block (``int_names`` then
    ``float_names``), its ``list_names`` columns as they came."""
    n = chunk.bad.size
    cols = chunk.columns
    if chunk.ints is not None:
        ints, missing = chunk.ints, chunk.missing
        floats = getattr(chunk, "floats", None)  # a float block beside the integer one, where a format has it
    else:
        ints = np.stack([cols[k].values for k in int_names], axis=1) if int_names else None
        floats = np.stack([cols[k].values for k in float_names], axis=1) if float_names else None
        missing = np.stack([cols[k].missing for k in int_names + float_names], axis=1)
    ints = np.zeros((n, 0), np.int64) if ints is None else np.ascontiguousarray(ints, dtype=np.int64)
    # (floats None or of no columns: the block of the ints alone; row_major copies floats as float64. Whether
    # any row is bad from its reasons: every bad row has one, ``note_bad`` reads it; no pass over ``bad``)
    block = ops.ColumnBlock.row_major(ints, np.ascontiguousarray(missing, dtype=bool), floats)
    return PackedChunk(block, {k: cols[k] for k in list_names} if list_names else {}, chunk.bad, chunk.reasons,
                       bool(chunk.reasons))


class ChunkArrays(NamedTuple):
    """Per chunk of a table over several files: its file, its number within that file, its rows, its read group
    (chunks of one group are read together) and its first row; then the table's rows."""

    file_of: np.ndarray
    chunk_local: np.ndarray
    chunk_rows: np.ndarray
    chunk_groups: np.ndarray
    first_row: np.ndarray
    num_rows: int


def chunk_arrays(indexes: list[ChunkIndex]) -> ChunkArrays:
    file_of, groups = [], []
    for f, index in enumerate(indexes):
        file_of += [f] * index.rows.size
        # A chunk of group -1 stands alone (read on its own); others share their group within the file.
        groups += [(f, int(g)) if g >= 0 else (f, -1 - k) for k, g in enumerate(index.groups.tolist())]
    chunk_rows = np.concatenate([i.rows for i in indexes] or [np.zeros(0, np.int64)]).astype(np.int64)
    numbers: dict[tuple[int, int], int] = {}
    return ChunkArrays(
        np.asarray(file_of, dtype=np.int64),
        np.concatenate([np.arange(i.rows.size) for i in indexes] or [np.zeros(0, np.int64)]),
        chunk_rows,
        np.asarray([numbers.setdefault(g, len(numbers)) for g in groups], dtype=np.int64),
        np.concatenate([[0], np.cumsum(chunk_rows)[:-1]]).astype(np.int64),
        int(chunk_rows.sum()))


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


_NO_BAD: dict[int, np.ndarray] = {}


def _no_bad_rows(n: int) -> np.ndarray:
    """``n`` False (no bad row), one read-only array per size shared by every batch (no array made per batch)."""
    bad = _NO_BAD.get(n)
    if bad is None:
        bad = np.zeros(n, dtype=bool)
        bad.flags.writeable = False
        bad = _NO_BAD.setdefault(n, bad)
    return bad


def _read_missing(table: ChunkedTable, rows: np.ndarray) -> bool:
    """The chunks holding ``rows`` that are not cached, read (or, where another thread reads one, waited for),
    with none made more lately used (see ``ChunkedTable.warm``); whether there were any (else a gather by address
    failed on a chunk with bad rows, which only the grouped gather reads). None are read where the cache cannot
    hold them all."""
    cache = table._cache
    needed = touched_chunks(rows, table.first_row, table.num_rows)
    if int(table.chunk_rows[needed].sum()) > cache.limit_rows:  # (they cannot all stay: the grouped gather holds them)
        return False
    missing = [c for c in needed.tolist() if cache.cached(c) is None]
    for c in missing:
        cache.get(c, table._load)
    return bool(missing)


def _gather_cached(table: ChunkedTable, rows, picks, missing_id, label, dense, ids) -> int | None:
    """``_gather_by_address`` over the table's cache, once more after reading the chunks it lacked (mostly one
    still being read by another thread's warming)."""
    got = _gather_by_address(table._cache, rows, table.first_row, table.num_rows, picks, missing_id, label, dense, ids)
    if got == -1 and _read_missing(table, rows):
        got = _gather_by_address(table._cache, rows, table.first_row, table.num_rows, picks, missing_id, label,
                                 dense, ids)
    return got


def _gather_by_address(cache, rows, first_row, num_rows, picks, missing_id, label, dense, ids):
    """The cached chunks of row records (a converted table's, a table cache's) read by address in one native call
    that also groups the rows (``gather_table``): no grouping arrays, chunk lists or addresses made per batch. None
    where no chunk has an address, else the kernel's answer (>= 0: done; -1 a chunk not cached (or with bad rows),
    -2 rows out of range, -3 not row records)."""
    addressed = cache.addressed()
    if addressed is None:
        return None
    held, addresses, layouts = addressed  # (``held``: every cached chunk, kept until the kernel is done)
    touched = np.empty(addresses.shape[0], dtype=np.int64)
    got = gather_table(rows, first_row, num_rows, addresses, layouts, picks, touched, missing_id=missing_id,
                       label=label, dense=dense, ids=ids)
    del held
    return got
