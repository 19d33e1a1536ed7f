"""feedline's converted tables: fixed-size records that a chunk is read from with one ``pread``, no parsing.

A folder holds ``feedline-columns.json`` (the columns, each column's stored integer type, the row count),
``rows.bin`` (one packed record per row, each column in the narrowest integer type that holds all its values)
and ``missing.bin`` (a row's missing flags, one bit per column). ``feedline convert`` writes it from text once;
any chunk of ``CHUNK_ROWS`` rows can then be read on its own, in any order.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ...pipelines.tabular import Column
from .chunked import ChunkIndex, RowsChunk
from .tabular import RowError

META = "feedline-columns.json"
VERSION = 1
CHUNK_ROWS = 1 << 14
_NARROW = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64))


def is_columnar(path: str | os.PathLike) -> bool:
    return os.path.isfile(os.path.join(path, META))


def narrowest(low: int, high: int) -> np.dtype:
    for dtype in _NARROW:
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return np.dtype(np.int64)


def record_dtype(names: list[str], dtypes: list[np.dtype]) -> np.dtype:
    return np.dtype([(n, d) for n, d in zip(names, dtypes)])  # packed: no padding between fields


def read_meta(folder: str) -> dict:
    try:
        meta = json.loads(Path(folder, META).read_text())
    except (OSError, ValueError) as e:
        raise RowError(folder, None, f"is not a feedline converted table ({META}: {e})") from None
    if meta.get("format") != "feedline-columns" or meta.get("version") != VERSION:
        raise RowError(folder, None, f"{META} is not a feedline converted table of version {VERSION}")
    return meta


class ColumnarFormat:
    def __init__(self, columns: tuple[Column, ...]):
        self.columns = columns
        self._layout: dict[str, tuple] = {}

    def index(self, folder: str) -> ChunkIndex:
        meta = read_meta(folder)
        stored = [c["name"] for c in meta["columns"]]
        absent = [c.name for c in self.columns if c.name not in stored]
        if absent:
            raise RowError(folder, None, f"has no column(s) {absent}; its columns are {stored}")
        dtype = record_dtype(stored, [np.dtype(c["dtype"]) for c in meta["columns"]])
        wanted = [stored.index(c.name) for c in self.columns]
        self._layout[folder] = (dtype, -(-len(stored) // 8), wanted)
        rows = int(meta["rows"])
        for name, size in (("rows.bin", rows * dtype.itemsize), ("missing.bin", rows * -(-len(stored) // 8))):
            if not os.path.isfile(os.path.join(folder, name)) or os.path.getsize(os.path.join(folder, name)) != size:
                raise RowError(os.path.join(folder, name), None, f"is missing or not {size} bytes long as "
                                                                 f"{META} says")
        starts = np.arange(0, rows, CHUNK_ROWS, dtype=np.int64)
        counts = np.minimum(CHUNK_ROWS, rows - starts)
        return ChunkIndex(starts, starts + counts, starts + 1, counts, np.full(counts.size, -1, dtype=np.int64))

    def load(self, folder: str, index: ChunkIndex, chunk: int) -> RowsChunk:
        dtype, bit_bytes, wanted = self._layout[folder]
        a, rows = int(index.starts[chunk]), int(index.rows[chunk])
        with open(os.path.join(folder, "rows.bin"), "rb") as f:
            raw = os.pread(f.fileno(), rows * dtype.itemsize, a * dtype.itemsize)
        with open(os.path.join(folder, "missing.bin"), "rb") as f:
            bits = os.pread(f.fileno(), rows * bit_bytes, a * bit_bytes)
        records = np.frombuffer(raw, dtype=dtype)
        ints = np.empty((rows, len(wanted)), dtype=np.int64)
        for k, j in enumerate(wanted):
            ints[:, k] = records[dtype.names[j]]
        flags = np.unpackbits(np.frombuffer(bits, dtype=np.uint8).reshape(rows, bit_bytes), axis=1,
                              count=len(dtype.names), bitorder="little").view(bool)
        return RowsChunk({}, np.zeros(rows, dtype=bool), {}, ints, np.ascontiguousarray(flags[:, wanted]))


class ColumnarWriter:
    """Appends blocks of rows (int64 values, missing flags) with the column types chosen beforehand."""

    def __init__(self, folder: Path, names: list[str], dtypes: list[np.dtype]):
        self.folder, self.names = folder, names
        self.dtype = record_dtype(names, dtypes)
        self.rows_file = open(folder / "rows.bin", "wb")
        self.missing_file = open(folder / "missing.bin", "wb")
        self.rows = 0

    def write(self, ints: np.ndarray, missing: np.ndarray) -> None:
        records = np.empty(ints.shape[0], dtype=self.dtype)
        for j, name in enumerate(self.names):
            records[name] = ints[:, j]
        self.rows_file.write(records.tobytes())
        self.missing_file.write(np.packbits(missing, axis=1, bitorder="little").tobytes())
        self.rows += ints.shape[0]

    def close(self, extra: dict) -> None:
        self.rows_file.close()
        self.missing_file.close()
        meta = {"format": "feedline-columns", "version": VERSION, "rows": self.rows,
                "columns": [{"name": n, "dtype": self.dtype[n].name} for n in self.names], **extra}
        (self.folder / META).write_text(json.dumps(meta, indent=1) + "\n")
