"""Synthetic Criteo click logs: the same layout as the real TSV (label, I1..I13, C1..C26) and similar statistics.

- label: 1 with probability ``POSITIVE_RATE``.
- I1..I13: long-tailed non-negative counts (floor of a log-normal), I2 also takes small negative values as the
  real I2 does; each column is empty (missing) at its own rate in ``DENSE_MISSING``.
- C1..C26: 8-digit lowercase hex ids of 32 bits; the id's popularity rank follows a truncated power law
  (Zipf-like) over ``CARDINALITIES[j]`` distinct values, and the rank is mapped to an id by a bijection of
  32-bit integers, so distinct ranks give distinct ids. Each column is missing at its rate in
  ``CATEGORICAL_MISSING``.

Rows are generated in fixed chunks, each from ``np.random.default_rng([seed, chunk])``, so a seed gives the
same bytes whatever the machine. Text is formatted with NumPy (no per-value Python), about 1M rows in a few
seconds.
"""
from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import numpy as np

from ..pipelines.validate import int_at_least, one_of, positive_int

NUM_DENSE = 13
NUM_CATEGORICAL = 26
POSITIVE_RATE = 0.25
CHUNK_ROWS = 1 << 17

CARDINALITIES = (
    1_400, 560, 1_000_000, 420_000, 300, 24, 12_000, 630, 10, 93_000, 5_700, 1_000_000, 3_200,
    27, 15_000, 700_000, 11, 5_600, 2_100, 12, 900_000, 18, 15, 290_000, 105, 140_000,
)
ZIPF_EXPONENT = tuple(1.05 + 0.25 * ((j * 7) % 26) / 25 for j in range(NUM_CATEGORICAL))
CATEGORICAL_MISSING = tuple(0.05 + 0.35 * ((j * 11) % 26) / 25 for j in range(NUM_CATEGORICAL))
DENSE_MISSING = tuple(0.05 + 0.35 * ((j * 5) % 13) / 12 for j in range(NUM_DENSE))
DENSE_LOG_MEAN = (0.5, 2.0, 1.5, 1.8, 7.5, 3.0, 1.5, 2.5, 3.5, 0.2, 1.0, 0.1, 1.8)
DENSE_LOG_SIGMA = 1.4
I2_NEGATIVE_RATE = 0.08
DENSE_MAX = 10**9 - 1

_DECIMAL_WIDTH = 10  # sign + 9 digits: every value lies in (-10**9, 10**9)
_HEX_WIDTH = 8
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_ID_MULTIPLIER = np.uint64(0x9E3779B1)  # odd, so rank -> rank * m + salt is a bijection mod 2**32
_MASK32 = np.uint64(0xFFFFFFFF)


def dense_names() -> list[str]:
    return [f"I{i}" for i in range(1, NUM_DENSE + 1)]


def categorical_names() -> list[str]:
    return [f"C{i}" for i in range(1, NUM_CATEGORICAL + 1)]


def make_criteo(out_path: str | os.PathLike, rows: int, seed: int, format: str = "tsv") -> dict:
    """Write ``rows`` synthetic rows to ``out_path``: Criteo TSV (gzip-compressed when the name ends in ``.gz``)
    or Parquet (columns ``label``, ``I1``..``I13`` as nullable int64, ``C1``..``C26`` as nullable hex strings).
    Returns a summary: path, rows, format, seed, bytes, seconds."""
    positive_int("rows", rows)
    int_at_least("seed", seed, 0)
    one_of("format", format, ("tsv", "parquet"))
    if not isinstance(out_path, (str, os.PathLike)):
        raise TypeError(f"out_path must be a path, got {type(out_path).__name__}")
    began = time.perf_counter()
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    chunks = (_chunk(int(seed), c, min(CHUNK_ROWS, rows - start))
              for c, start in enumerate(range(0, int(rows), CHUNK_ROWS)))
    if format == "parquet":
        _write_parquet(path, chunks)
    else:
        opener = gzip.open if path.name.endswith(".gz") else open
        kwargs = {"compresslevel": 1} if opener is gzip.open else {}
        with opener(path, "wb", **kwargs) as f:
            for chunk in chunks:
                f.write(_format_tsv(*chunk))
    return {"path": str(path), "rows": int(rows), "format": format, "seed": int(seed),
            "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - began, 3)}


def _chunk(seed: int, index: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """label [n], dense [n, 13] int64, dense_missing [n, 13], ids [n, 26] uint32, ids_missing [n, 26]."""
    rng = np.random.default_rng([seed, index])
    label = (rng.random(n) < POSITIVE_RATE).astype(np.int64)
    log_values = rng.normal(np.asarray(DENSE_LOG_MEAN), DENSE_LOG_SIGMA, size=(n, NUM_DENSE))
    dense = np.minimum(np.floor(np.expm1(np.maximum(log_values, 0.0))), DENSE_MAX).astype(np.int64)
    negative = rng.random(n) < I2_NEGATIVE_RATE
    dense[negative, 1] = -rng.integers(1, 4, size=int(negative.sum()))
    dense_missing = rng.random((n, NUM_DENSE)) < np.asarray(DENSE_MISSING)
    ids = np.empty((n, NUM_CATEGORICAL), dtype=np.uint32)
    for j, (card, s) in enumerate(zip(CARDINALITIES, ZIPF_EXPONENT)):
        rank = _power_law_rank(rng.random(n), card, s)
        salt = np.uint64(rng.integers(0, 1 << 32))
        ids[:, j] = ((rank.astype(np.uint64) * _ID_MULTIPLIER + salt) & _MASK32).astype(np.uint32)
    ids_missing = rng.random((n, NUM_CATEGORICAL)) < np.asarray(CATEGORICAL_MISSING)
    return label, dense, dense_missing, ids, ids_missing


def _power_law_rank(u: np.ndarray, cardinality: int, exponent: float) -> np.ndarray:
    """Inverse CDF of a density proportional to r**-exponent on [1, cardinality + 1), floored to 0-based ranks."""
    a = 1.0 - exponent
    top = float(cardinality + 1) ** a
    r = (1.0 + u * (top - 1.0)) ** (1.0 / a)
    return np.minimum(np.floor(r).astype(np.int64) - 1, cardinality - 1)


def _format_tsv(label, dense, dense_missing, ids, ids_missing) -> bytes:
    """Every row as a fixed-width slot matrix plus a keep-mask; the kept bytes, row-major, are the TSV text."""
    n = label.shape[0]
    slots = [_decimal_slots(label[:, None], np.zeros((n, 1), dtype=bool), width=1)]
    slots.append(_decimal_slots(dense, dense_missing, _DECIMAL_WIDTH))
    slots.append(_hex_slots(ids, ids_missing))
    chars = np.concatenate([s[0] for s in slots], axis=1)
    keep = np.concatenate([s[1] for s in slots], axis=1)
    # Each field slot is followed by a tab; the last tab of the row becomes the newline.
    return chars[keep].tobytes()


def _with_separators(chars: np.ndarray, keep: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    n, k = chars.shape[0], chars.shape[1] // width
    chars = np.concatenate([chars.reshape(n, k, width), np.full((n, k, 1), ord("\t"), np.uint8)], axis=2)
    keep = np.concatenate([keep.reshape(n, k, width), np.ones((n, k, 1), dtype=bool)], axis=2)
    return chars.reshape(n, -1), keep.reshape(n, -1)


def _decimal_slots(values: np.ndarray, missing: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    n, k = values.shape
    magnitude = np.abs(values)
    negative = values < 0
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (magnitude[:, :, None] // powers) % 10
    num_digits = np.maximum(1, np.floor(np.log10(np.maximum(magnitude, 1))).astype(np.int64) + 1)
    position = np.arange(width)
    first = width - num_digits - negative
    keep = (position >= first[:, :, None]) & ~missing[:, :, None]
    chars = (digits + ord("0")).astype(np.uint8)
    sign = negative[:, :, None] & (position == first[:, :, None])
    chars[sign] = ord("-")
    return _with_separators(chars.reshape(n, -1), keep.reshape(n, -1), width)


def _hex_slots(ids: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, k = ids.shape
    shifts = np.arange(4 * (_HEX_WIDTH - 1), -1, -4, dtype=np.uint32)
    chars = _HEX_DIGITS[(ids[:, :, None] >> shifts) & np.uint32(15)]
    keep = np.broadcast_to(~missing[:, :, None], chars.shape)
    chars, keep = _with_separators(chars.reshape(n, -1), keep.reshape(n, -1), _HEX_WIDTH)
    chars[:, -1] = ord("\n")
    return chars, keep


def _write_parquet(path: Path, chunks) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    try:
        for label, dense, dense_missing, ids, ids_missing in chunks:
            columns = {"label": pa.array(label)}
            for j, name in enumerate(dense_names()):
                columns[name] = pa.array(dense[:, j], mask=dense_missing[:, j])
            for j, name in enumerate(categorical_names()):
                columns[name] = _hex_string_array(ids[:, j], ids_missing[:, j])
            table = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()


def _hex_string_array(ids: np.ndarray, missing: np.ndarray):
    import pyarrow as pa

    shifts = np.arange(4 * (_HEX_WIDTH - 1), -1, -4, dtype=np.uint32)
    chars = _HEX_DIGITS[(ids[~missing, None] >> shifts) & np.uint32(15)]
    lengths = np.where(missing, 0, _HEX_WIDTH).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    validity = pa.array(~missing).buffers()[1]
    return pa.StringArray.from_buffers(ids.size, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes()),
                                       validity, null_count=int(missing.sum()))
