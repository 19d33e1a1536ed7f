"""feedline's converted tables: integer columns stored as fixed-size row records, chunk by chunk, so a chunk is
read with one ``pread`` straight into the buffer a batch's rows are then gathered from, with no parsing and no
conversion.

A folder holds ``feedline-columns.json`` (the columns, each column's stored integer type, the row count, the
rows per chunk) and ``records.bin``: chunk after chunk of ``chunk_rows`` rows (the last one shorter), each
chunk holding its rows' records, then its rows' missing flags, each part padded to a multiple of 8 bytes. A
record holds every column in the narrowest integer type that holds all its values (little-endian), the widest
types first so that each value is aligned to its size, padded to a multiple of 8 bytes; a row's flags are one
bit per column (column ``j`` in bit ``j % 8`` of byte ``j // 8``). Row-major records suit a shuffled batch,
which takes scattered rows: each row it takes is two or three cache lines, where a column-major chunk would
have every row cost a cache line per column. ``ops.gather_columns`` reads the records as they are.

``feedline convert`` writes version 2 (this layout). Version 1 folders (``rows.bin`` of packed row records and
``missing.bin``) are still read, through a slower conversion of each chunk.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np

from ... import ops
from ...pipelines.tabular import Column
from .chunked import ChunkIndex, RowsChunk
from .table_rows import RowError

META = "feedline-columns.json"
VERSION = 2
READS = (1, 2)  # the versions this module reads
CHUNK_ROWS = 1 << 14
DATA = "records.bin"
_NARROW = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64))
_BOUNDS = tuple((d, int(np.iinfo(d).min), int(np.iinfo(d).max)) for d in _NARROW)  # (``np.iinfo`` costs a µs a call)


def narrowest(low: int, high: int) -> np.dtype:
    for dtype, smallest, largest in _BOUNDS:
        if smallest <= low and high <= largest:
            return dtype
    return np.dtype(np.int64)


def record_dtype(names: list[str], dtypes: list[np.dtype]) -> np.dtype:
    return np.dtype([(n, d) for n, d in zip(names, dtypes)])  # packed: no padding between fields


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


class RecordLayout:
    """Where each column lies in a record (bytes from the record's start: widest types first, so each value is
    aligned to its size), the record's size (a multiple of 8) and the flag bytes per row."""

    def __init__(self, dtypes: list[np.dtype]):
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.offsets = [0] * len(self.dtypes)
        at = 0
        for j in sorted(range(len(self.dtypes)), key=lambda j: -self.dtypes[j].itemsize):  # stable
            self.offsets[j] = at
            at += self.dtypes[j].itemsize
        self.record = _padded(at)
        self.flag_bytes = -(-len(self.dtypes) // 8)
        self._blocks: dict[tuple, ops.ColumnBlock] = {}

    def chunk_bytes(self, rows: int) -> int:
        return _padded(rows * self.record) + _padded(rows * self.flag_bytes)

    def block(self, data: np.ndarray, rows: int, columns: list[int]) -> ops.ColumnBlock:
        """The ``columns`` of a chunk of ``rows`` rows read into ``data`` (the block's layout made once per
        chunk size: every full chunk has the same)."""
        key = (rows, tuple(columns))
        made = self._blocks.get(key)
        if made is None:
            flags_at = _padded(rows * self.record)
            made = self._blocks[key] = ops.ColumnBlock.records(
                np.zeros(8, np.uint8), [self.dtypes[j] for j in columns], [self.offsets[j] for j in columns],
                self.record, flags_at, columns, self.flag_bytes, rows)
        return made._replace(data=data, flags=data)


def read_meta(folder: str) -> dict:
    try:
        meta = json.loads(Path(folder, META).read_text())
    except (OSError, ValueError) as e:
        raise RowError(folder, None, f"is not a feedline converted table ({META}: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != "feedline-columns":
        raise RowError(folder, None, f"{META} is not a feedline converted table")
    if meta.get("version") not in READS:
        raise RowError(folder, None, f"{META} is a converted table of version {meta.get('version')!r}; this "
                                     f"feedline reads versions {list(READS)}: convert the files again")
    return meta


class ColumnarFormat:
    def __init__(self, columns: tuple[Column, ...]):
        self.columns = columns
        self._tables: dict[str, dict] = {}

    def index(self, folder: str) -> ChunkIndex:
        meta = read_meta(folder)
        try:
            stored = [c["name"] for c in meta["columns"]]
            dtypes = [np.dtype(c["dtype"]) for c in meta["columns"]]
            rows = int(meta["rows"])
            per_chunk = int(meta.get("chunk_rows", CHUNK_ROWS))
        except (KeyError, TypeError, ValueError) as e:
            raise RowError(folder, None, f"{META} is not a feedline converted table ({type(e).__name__}: {e})") \
                from None
        if rows < 0 or per_chunk < 1 or any(d not in _NARROW for d in dtypes):
            raise RowError(folder, None, f"{META} holds impossible values (rows {rows}, chunk_rows {per_chunk}, "
                                         f"types {[d.name for d in dtypes]})")
        absent = [c.name for c in self.columns if c.name not in stored]
        if absent:
            raise RowError(folder, None, f"has no column(s) {absent}; its columns are {stored}")
        wanted = [stored.index(c.name) for c in self.columns]
        starts = np.arange(0, rows, per_chunk, dtype=np.int64)
        counts = np.minimum(per_chunk, rows - starts)
        if meta["version"] == 1:
            sizes = {"rows.bin": rows * record_dtype(stored, dtypes).itemsize,
                     "missing.bin": rows * -(-len(stored) // 8)}
        else:
            layout = RecordLayout(dtypes)
            sizes = {DATA: layout.chunk_bytes(per_chunk) * (counts.size - 1) + layout.chunk_bytes(int(counts[-1]))
                     if counts.size else 0}
        for name, size in sizes.items():
            path = os.path.join(folder, name)
            if not os.path.isfile(path) or os.path.getsize(path) != size:
                raise RowError(path, None, f"is missing or not {size} bytes long as {META} says")
        self._tables[folder] = {"version": meta["version"], "stored": stored, "dtypes": dtypes, "wanted": wanted,
                                "chunk_rows": per_chunk, "layout": RecordLayout(dtypes)}
        return ChunkIndex(starts, starts + counts, starts + 1, counts, np.full(counts.size, -1, dtype=np.int64))

    def cached_row_bytes(self, folder: str) -> float:
        """Bytes a row of a chunk read by ``load_block`` takes: its record and its flags."""
        table = self._tables[folder]
        if table["version"] == 1:
            return 9.0 * len(table["wanted"])
        return float(table["layout"].record + table["layout"].flag_bytes)

    def load_block(self, folder: str, index: ChunkIndex, chunk: int,
                   spare: Callable[[int], np.ndarray | None] = lambda nbytes: None) -> ops.ColumnBlock:
        """The chunk as it lies in the file, read with one ``pread`` into ``spare(nbytes)`` (a buffer of an
        evicted chunk nobody reads any more) or a new buffer; its wanted columns as a block."""
        table = self._tables[folder]
        if table["version"] == 1:
            rows = self.load(folder, index, chunk)
            return ops.ColumnBlock.row_major(rows.ints, rows.missing)
        rows = int(index.rows[chunk])
        layout: RecordLayout = table["layout"]
        size = layout.chunk_bytes(rows)
        data = spare(max(size, 8))
        data = np.empty(max(size, 8), dtype=np.uint8) if data is None else data
        path = os.path.join(folder, DATA)
        fd = os.open(path, os.O_RDONLY)  # (no file object: open() builds two, 11 us a chunk here, os.open 3 us)
        try:
            got = os.preadv(fd, [memoryview(data)[:size]], int(chunk) * layout.chunk_bytes(table["chunk_rows"]))
        finally:
            os.close(fd)
        if got != size:
            raise RowError(path, None, f"ended inside chunk {chunk} (read {got} of {size} bytes); the file changed "
                                       f"after it was opened")
        return layout.block(data, rows, table["wanted"])

    def load(self, folder: str, index: ChunkIndex, chunk: int) -> RowsChunk:
        table = self._tables[folder]
        rows = int(index.rows[chunk])
        if table["version"] != 1:
            block = self.load_block(folder, index, chunk)
            ints, _, missing = ops.gather_raw(block, np.arange(len(table["wanted"])), np.zeros(0, np.int64),
                                              np.arange(rows))
            return RowsChunk({}, np.zeros(rows, dtype=bool), {}, ints, missing)
        stored, wanted = table["stored"], table["wanted"]
        dtype = record_dtype(stored, table["dtypes"])
        bit_bytes = -(-len(stored) // 8)
        a = int(index.starts[chunk])
        with open(os.path.join(folder, "rows.bin"), "rb") as f:
            raw = os.pread(f.fileno(), rows * dtype.itemsize, a * dtype.itemsize)
        with open(os.path.join(folder, "missing.bin"), "rb") as f:
            bits = os.pread(f.fileno(), rows * bit_bytes, a * bit_bytes)
        records = np.frombuffer(raw, dtype=dtype)
        ints = np.empty((rows, len(wanted)), dtype=np.int64)
        for k, j in enumerate(wanted):
            ints[:, k] = records[dtype.names[j]]
        flags = np.unpackbits(np.frombuffer(bits, dtype=np.uint8).reshape(rows, bit_bytes), axis=1,
                              count=len(stored), bitorder="little").view(bool)
        return RowsChunk({}, np.zeros(rows, dtype=bool), {}, ints, np.ascontiguousarray(flags[:, wanted]))


class ColumnarWriter:
    """Appends blocks of rows (int64 values, missing flags) with the column types chosen beforehand, a chunk of
    ``CHUNK_ROWS`` rows at a time."""

    def __init__(self, folder: Path, names: list[str], dtypes: list[np.dtype]):
        self.folder, self.names = folder, names
        self.dtypes = [np.dtype(d) for d in dtypes]
        self.layout = RecordLayout(self.dtypes)
        self.data_file = open(folder / DATA, "wb")
        self.rows = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0

    def write(self, ints: np.ndarray, missing: np.ndarray) -> None:
        self._pending.append((ints, missing))
        self._pending_rows += ints.shape[0]
        self.rows += ints.shape[0]
        if self._pending_rows >= CHUNK_ROWS:
            ints = np.concatenate([i for i, _ in self._pending])
            missing = np.concatenate([m for _, m in self._pending])
            whole = ints.shape[0] // CHUNK_ROWS * CHUNK_ROWS
            for a in range(0, whole, CHUNK_ROWS):
                self._chunk(ints[a:a + CHUNK_ROWS], missing[a:a + CHUNK_ROWS])
            self._pending = [(ints[whole:], missing[whole:])]
            self._pending_rows = ints.shape[0] - whole

    def _chunk(self, ints: np.ndarray, missing: np.ndarray) -> None:
        rows = ints.shape[0]
        layout = self.layout
        out = np.zeros(layout.chunk_bytes(rows), dtype=np.uint8)
        records = out[:rows * layout.record].reshape(rows, layout.record)
        for j, dtype in enumerate(self.dtypes):
            field = records[:, layout.offsets[j]:layout.offsets[j] + dtype.itemsize]
            field[...] = ints[:, j].astype(dtype.newbyteorder("<")).view(np.uint8).reshape(rows, dtype.itemsize)
        flags_at = _padded(rows * layout.record)
        bits = np.packbits(missing, axis=1, bitorder="little")  # [rows, flag bytes]
        out[flags_at:flags_at + bits.size] = bits.reshape(-1)
        self.data_file.write(out.tobytes())

    def close(self, extra: dict) -> None:
        if self._pending_rows:
            self._chunk(np.concatenate([i for i, _ in self._pending]), np.concatenate([m for _, m in self._pending]))
        self._pending, self._pending_rows = [], 0
        self.data_file.close()
        meta = {"format": "feedline-columns", "version": VERSION, "rows": self.rows, "chunk_rows": CHUNK_ROWS,
                "columns": [{"name": n, "dtype": d.name} for n, d in zip(self.names, self.dtypes)], **extra}
        (self.folder / META).write_text(json.dumps(meta, indent=1) + "\n")
