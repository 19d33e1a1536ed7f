"""``ops.gather_columns`` over blocks whose missing flags are bytes (parsed text's row-major blocks, and any
other layout a format gives): every integer type to the id and dense rows, in one pass per column without a
branch on the flag, writes exactly what NumPy's reference writes, missing or not, in any order of rows."""
from __future__ import annotations

import numpy as np
import pytest

from feedline import ops
from feedline.ops import _native
from feedline.ops.gather_columns import BYTE_FLAGS, CODES, gather_columns

rng = np.random.default_rng(31)
INTS = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64]


def byte_flag_block(columns, missing) -> ops.ColumnBlock:
    """Each column's values one after another (each aligned to 8 bytes), and one flag byte a row per column,
    interleaved (row ``r``'s flag of column ``c`` at byte ``r * C + c``), as a row-major mask lies."""
    rows = columns[0].size
    data = bytearray()
    layout = []
    for c, values in enumerate(columns):
        data += b"\0" * (-len(data) % 8)
        layout.append([CODES[values.dtype], len(data) // values.itemsize, 1, BYTE_FLAGS, c, len(columns)])
        data += values.tobytes()
    data += b"\0" * (-len(data) % 8)
    flags = np.ascontiguousarray(np.stack(missing, axis=1)).view(np.uint8).reshape(-1)
    return ops.ColumnBlock(np.frombuffer(bytes(data), np.uint8), flags, np.array(layout, np.int64), rows)


def gathered(block, picks, local, positions, n, ids_rows, dense_rows):
    label = np.full(n, -5, np.float32)
    dense = np.full((dense_rows, n), -5, np.float32)
    ids = np.full((ids_rows, n), -5, np.int64)
    gather_columns(block, picks, local, positions, missing_id=-99, label=label, dense=dense, ids=ids)
    return label, dense, ids


@pytest.mark.skipif(_native.kernels("gather") is None, reason="numba is not installed")
@pytest.mark.parametrize("rate", [0.0, 0.4, 1.0])
def test_byte_flag_columns_equal_numpy_for_every_integer_type(rate, monkeypatch):
    rows = 900
    columns = [rng.integers(np.iinfo(t).min, np.iinfo(t).max, rows, dtype=t, endpoint=True) for t in INTS]
    missing = [rng.random(rows) < rate for _ in INTS]
    block = byte_flag_block(columns, missing)
    count = len(INTS)
    picks = ops.gather_picks(count - 1, list(range(count)), list(range(count)))
    local = rng.integers(0, rows, 700)
    positions = rng.permutation(800)[:700]
    got = gathered(block, picks, local, positions, 800, count, count)
    monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    try:
        want = gathered(block, picks, local, positions, 800, count, count)
    finally:
        monkeypatch.delenv(_native.ENV)
        _native.kernels.cache_clear()
    for a, b in zip(got, want):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    for c in range(count):  # and against the values themselves
        gone = missing[c][local]
        assert np.array_equal(got[2][c, positions], np.where(gone, -99, columns[c][local].astype(np.int64)))
        want_dense = np.where(gone, np.float32(np.nan), columns[c][local].astype(np.float32))
        assert np.array_equal(got[1][c, positions].view(np.uint32), want_dense.view(np.uint32))
    assert (got[2][:, np.setdiff1d(np.arange(800), positions)] == -5).all()
