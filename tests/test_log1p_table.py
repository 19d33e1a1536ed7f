"""``normalize_columns`` looks the log1p of whole values up in a table (``_normalize_numba.log1p_table``): every
value the table holds, the values at and next to its ends, signed zeros and a spread of bit patterns give the same
bits as ``normalize_dense`` (NumPy, ``log1p64``), with and without fill and clipping."""
from __future__ import annotations

import numpy as np
import pytest

from feedline import ops
from feedline.ops import _native
from feedline.ops.log1p64 import log1p_float32
from feedline.ops.normalize_columns import LOG1P_TABLE_SIZE, _log1p_table

pytestmark = pytest.mark.skipif(_native.kernels("normalize") is None, reason="numba is not installed")


def test_the_table_is_log1p64_of_each_whole_value():
    table = _log1p_table(_native.kernels("normalize"))
    whole = np.arange(LOG1P_TABLE_SIZE, dtype=np.float32)
    assert np.array_equal(table.view(np.uint32), log1p_float32(whole).view(np.uint32))


@pytest.mark.parametrize("fill,clip", [(0.0, 0.0), (-0.0, None), (7.0, -0.0), (-5.0, None), (0.5, 3.0)])
def test_whole_values_in_and_around_the_table_equal_normalize_dense(fill, clip):
    rng = np.random.default_rng(7)
    n = LOG1P_TABLE_SIZE
    values = np.concatenate([
        np.arange(-3, n + 3, dtype=np.float32), np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 0.5, n - 0.5, 2**31,
                                                          -(2**31), 2**24 + 2, 1e-45, -1e-45], dtype=np.float32),
        np.nextafter(np.arange(n, dtype=np.float32), np.float32(np.inf)),
        np.nextafter(np.arange(1, n, dtype=np.float32), np.float32(-np.inf)),
        rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    raw = np.stack([values, values[::-1].copy()])
    plan = ops.dense_plan([0, 1, 0], [fill, fill, 0.0], [clip, clip, None], [True, True, False])
    out = ops.normalize_columns(raw, plan)
    for j, (source, f, c, log) in enumerate([(0, fill, clip, True), (1, fill, clip, True), (0, 0.0, None, False)]):
        want = ops.normalize_dense(raw[source], f, c, log)
        assert np.array_equal(out[:, j].view(np.uint32), want.view(np.uint32)), j


def test_a_column_of_misses_only_and_an_empty_batch():
    raw = np.full((1, 1000), 1e6, dtype=np.float32)
    raw[0, ::3] = -0.0
    plan = ops.dense_plan([0], [0.0], [None], [True])
    out = ops.normalize_columns(raw, plan)
    assert np.array_equal(out[:, 0].view(np.uint32), ops.normalize_dense(raw[0], 0.0, None, True).view(np.uint32))
    assert ops.normalize_columns(np.empty((1, 0), np.float32), plan).shape == (0, 1)


def test_many_columns_and_rows_in_blocks_of_any_size():
    rng = np.random.default_rng(3)
    raw = np.floor(rng.lognormal(3, 3, (5, 1001))).astype(np.float32)
    raw[rng.random(raw.shape) < 0.2] = np.nan
    for columns in (1, 13, 700):
        sources = rng.integers(0, 5, columns)
        logs = [bool(b) for b in rng.random(columns) < 0.8]
        plan = ops.dense_plan(sources, [1.0] * columns, [0.0] * columns, logs)
        out = ops.normalize_columns(raw, plan)
        for j in range(columns):
            want = ops.normalize_dense(raw[sources[j]], 1.0, 0.0, logs[j])
            assert np.array_equal(out[:, j].view(np.uint32), want.view(np.uint32)), (columns, j)
