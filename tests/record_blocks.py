"""Test data for converted tables' chunks: random values of every column type, and blocks of row records with
bit flags as ``RecordLayout`` stores a chunk, written byte by byte here (the reference the kernels are read
against)."""
from __future__ import annotations

import numpy as np

from feedline.loader.sources.columnar import RecordLayout

EVERY_TYPE = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64, np.float32, np.float64] * 2


def some_values(rng: np.random.Generator, dtype, rows: int) -> np.ndarray:
    """``rows`` values of ``dtype``: a type's whole range for integers, wide normals for floats."""
    if np.dtype(dtype).kind == "f":
        return rng.normal(0, 1e6, rows).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, rows, dtype=dtype, endpoint=True)


def record_block(rng: np.random.Generator, types, rows: int, missing_share: float = 0.3):
    """A block of ``rows`` records of columns of ``types``, with its columns' values and missing flags."""
    columns = [some_values(rng, d, rows) for d in types]
    missing = [rng.random(rows) < missing_share for _ in types]
    records = RecordLayout([np.dtype(d) for d in types])
    data = np.zeros(records.chunk_bytes(rows), dtype=np.uint8)
    view = data[:rows * records.record].reshape(rows, records.record)
    for j, values in enumerate(columns):
        view[:, records.offsets[j]:records.offsets[j] + values.itemsize] = values.view(np.uint8).reshape(rows, -1)
    flags_at = -(-rows * records.record // 8) * 8
    bits = np.packbits(np.stack(missing, axis=1), axis=1, bitorder="little")
    data[flags_at:flags_at + bits.size] = bits.reshape(-1)
    return records.block(data, rows, list(range(len(types)))), columns, missing


def per_block_reference(blocks, picks, bounds, local, positions, want, monkeypatch, missing_id: int = -99):
    """``want`` (label, dense, ids) written by NumPy's ``gather_columns``, one call per block (group ``g``'s rows
    from ``blocks[g]``): the reference the one-call kernels are read against."""
    from feedline import ops
    from feedline.ops import _native

    monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    try:
        for g, block in enumerate(blocks):
            at = slice(bounds[g], bounds[g + 1])
            ops.gather_columns(block, picks, local[at], positions[at], missing_id=missing_id, label=want[0],
                               dense=want[1], ids=want[2])
    finally:
        monkeypatch.delenv(_native.ENV)
        _native.kernels.cache_clear()
    return want


def criteo_day_in_chunks(root, rows: int, seed: int, chunk_rows: int):
    """A Criteo day of ``rows`` as text and converted in chunks of ``chunk_rows``: the two pipelines over it."""
    import pytest

    from feedline.datagen.synthetic_criteo import make_criteo
    from feedline.loader.sources import columnar
    from feedline.loader.sources.text_to_columnar import convert
    from feedline.pipelines.criteo import criteo

    make_criteo(root / "day.tsv", rows, seed=seed)
    patch = pytest.MonkeyPatch()
    patch.setattr(columnar, "CHUNK_ROWS", chunk_rows)
    try:
        convert(criteo(root / "day.tsv").source, root / "conv")
    finally:
        patch.undo()
    return criteo(root / "day.tsv"), criteo(root / "conv")
