"""pyarrow's CSV reader on the same Criteo TSV, for ``feedline bench --pipeline criteo --baseline pyarrow``.

* parse only (:func:`read_table`): ``pyarrow.csv.read_csv`` of the whole file on all cores, counts as int64 and
  the ids as strings: the rate to beat from text (it delivers an Arrow table, not batches).
* pyarrow + NumPy end to end (:func:`epoch_batches`): the same parse, then what feedline delivers, computed with
  whole-column NumPy: float32 ``label``; float32 ``dense`` = ``log1p`` of the counts with missing as 0 and
  negatives clipped to 0; the ids decoded from hex from the Arrow string buffers and hashed with feedline's
  ``ops.hash_buckets`` (seed ``j`` for ``C{j+1}``, a missing id as ``MISSING_ID``), so the ids equal feedline's;
  then every epoch a seeded row permutation, cut into batches of torch tensors with the ids in
  ``KeyedJaggedTensor`` form (key-major ``values``, ``lengths``, ``offsets``). Each epoch parses the text again,
  as feedline reading the TSV does.
"""
from __future__ import annotations

import itertools
import os
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import torch

from ..ops import hash_buckets
from ..pipelines.criteo import CATEGORICAL_NAMES, DENSE_NAMES
from ..pipelines.tabular import MISSING_ID
from .side_process import Opened

NAMES = ("label", *DENSE_NAMES, *CATEGORICAL_NAMES)
MAX_HEX_DIGITS = 15  # the largest id whose value fits an int64 with room to spare
NOTES = (
    "pyarrow_parse: pyarrow.csv.read_csv of the whole file on all cores, ids as strings: parsing only, "
    "no features and no batches",
    "pyarrow_numpy: the same parse each epoch, then label, log1p dense and ids hashed with feedline's "
    "ops.hash_buckets (the same ids as feedline's), a seeded row permutation per epoch and key-major batches, "
    "all in whole-column NumPy on the iterating thread",
)

_NIBBLES = np.full(256, 255, dtype=np.uint8)
for _value, _digits in enumerate(zip(b"0123456789abcdef", b"0123456789ABCDEF")):
    _NIBBLES[list(_digits)] = _value


def read_table(path: str | os.PathLike) -> pa.Table:
    """The TSV as an Arrow table: ``label`` and ``I1``..``I13`` int64 (an empty field is null), ``C1``..``C26``
    strings (an empty field is ``""``)."""
    types = {name: (pa.string() if name in CATEGORICAL_NAMES else pa.int64()) for name in NAMES}
    return pa_csv.read_csv(os.fspath(path), read_options=pa_csv.ReadOptions(column_names=list(NAMES)),
                           parse_options=pa_csv.ParseOptions(delimiter="\t", quote_char=False),
                           convert_options=pa_csv.ConvertOptions(column_types=types))


def decode_hex(column: pa.ChunkedArray, name: str) -> np.ndarray:
    """int64 value of each hexadecimal string of ``column``, ``MISSING_ID`` for an empty one, from the Arrow
    buffers with no Python per value. A string that is not hexadecimal, or longer than ``MAX_HEX_DIGITS``, is a
    ``ValueError`` naming the column and the row."""
    out = np.empty(len(column), dtype=np.int64)
    start = 0
    for chunk in column.chunks:
        n = len(chunk)
        if chunk.null_count:
            raise ValueError(f"{name}: {chunk.null_count} null ids; read_table gives empty strings")
        _, offsets_buffer, data_buffer = chunk.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=4 * chunk.offset)
        lengths = np.diff(offsets)
        if n and lengths.max() > MAX_HEX_DIGITS:
            row = start + int(np.argmax(lengths))
            raise ValueError(f"{name}: row {row}: an id of {lengths.max()} hexadecimal digits (at most "
                             f"{MAX_HEX_DIGITS})")
        first, last = int(offsets[0]), int(offsets[-1])
        data = np.frombuffer(data_buffer, dtype=np.uint8)[first:last] if last > first else np.empty(0, np.uint8)
        nibbles = _NIBBLES[data]
        if (nibbles == 255).any():
            row = int(np.searchsorted(offsets, first + int(np.argmax(nibbles == 255)), side="right")) - 1
            raise ValueError(f"{name}: row {start + row}: {chunk[row].as_py()!r} is not a hexadecimal id")
        row_of_byte = np.repeat(np.arange(n), lengths)
        digits_after = offsets[1:][row_of_byte] - 1 - np.arange(first, last)
        weighted = nibbles.astype(np.int64) << (4 * digits_after).astype(np.int64)
        present = lengths > 0
        values = np.full(n, MISSING_ID, dtype=np.int64)
        if present.any():
            values[present] = np.add.reduceat(weighted, (offsets[:-1] - first)[present])
        out[start:start + n] = values
        start += n
    return out


def features(table: pa.Table, table_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 ``label`` [N], float32 ``dense`` [N, 13] and int64 hashed ``ids`` key-major [26, N]."""
    n = table.num_rows
    label = pc.fill_null(table.column("label"), 0).to_numpy().astype(np.float32)
    dense = np.empty((n, len(DENSE_NAMES)), dtype=np.float32)
    for j, name in enumerate(DENSE_NAMES):
        counts = np.maximum(pc.fill_null(table.column(name), 0).to_numpy(), 0).astype(np.float32)
        dense[:, j] = np.log1p(counts.astype(np.float64))
    ids = np.empty((len(CATEGORICAL_NAMES), n), dtype=np.int64)
    for j, name in enumerate(CATEGORICAL_NAMES):
        ids[j] = hash_buckets(decode_hex(table.column(name), name), table_size, seed=j)
    return label, dense, ids


def epoch_batches(path: str | os.PathLike, batch_size: int, table_size: int, seed: int, epoch: int,
                  shuffle: bool = True):
    """One epoch of the pyarrow + NumPy baseline: parse, features, then batches of a seeded row permutation
    (file order with ``shuffle=False``), each a dict as feedline's: ``label``, ``dense``, ``index`` and
    ``sparse`` = ``keys``, ``values`` int64, ``lengths`` int32, ``offsets`` int64."""
    label, dense, ids = features(read_table(path), table_size)
    n = len(label)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n)
    keys = list(CATEGORICAL_NAMES)
    for start in range(0, n, batch_size):
        rows = order[start:start + batch_size]
        values = torch.from_numpy(ids[:, rows].reshape(-1))
        yield {"label": torch.from_numpy(label[rows]), "dense": torch.from_numpy(dense[rows]),
               "index": torch.from_numpy(rows), "sparse": {
                   "keys": keys, "values": values, "lengths": torch.ones(values.numel(), dtype=torch.int32),
                   "offsets": torch.arange(values.numel() + 1, dtype=torch.int64)}}


def _parsed(path: str) -> Iterator[pa.Table]:
    yield read_table(path)


def open_parse(path: str) -> Opened:
    """Parse only: each epoch is one table of the whole file."""
    return Opened(make=lambda: _parsed(path))


def open_numpy(path: str, batch_size: int, table_size: int, seed: int = 0) -> Opened:
    """pyarrow + NumPy end to end, epoch after epoch (each with its own permutation)."""
    epochs = itertools.count()
    return Opened(make=lambda: epoch_batches(path, batch_size, table_size, seed, next(epochs)))
