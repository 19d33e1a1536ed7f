"""ops.batch_rows: a batch's rows and validity written in one pass, the valid rows counted; the kernel against
its NumPy reference."""
from __future__ import annotations

import numpy as np
import pytest

from feedline.ops import _native
from feedline.ops.batch_rows import batch_rows


def _reference(indices, valid, bad):
    return indices.copy(), valid & ~bad, int(np.count_nonzero(valid & ~bad))


@pytest.mark.parametrize("native", [True, False])
def test_batch_rows_matches_numpy(native, monkeypatch):
    if not native:
        monkeypatch.setenv(_native.ENV, "0")
        _native.kernels.cache_clear()
    try:
        rng = np.random.default_rng(3)
        for n in (0, 1, 7, 8192):
            for p_invalid, p_bad in ((0.0, 0.0), (0.01, 0.0), (0.0, 0.3), (0.5, 0.5), (1.0, 0.0)):
                indices = rng.integers(0, 1 << 40, n)
                valid = rng.random(n) >= p_invalid
                bad = rng.random(n) < p_bad
                if not bad.any():  # (a source's shared read-only "no bad row" array)
                    bad.flags.writeable = False
                index_out = np.full(n, -5, np.int64)
                valid_out = np.zeros(n, bool) if n % 2 else np.ones(n, bool)
                count = batch_rows(indices, valid, bad, index_out, valid_out)
                want_index, want_valid, want_count = _reference(indices, valid, bad)
                assert count == want_count and type(count) is int
                assert np.array_equal(index_out, want_index) and np.array_equal(valid_out, want_valid)
        # strided inputs (a plan's views of a larger array)
        indices = np.arange(40, dtype=np.int64)[::2]
        valid = np.ones(40, bool)[1::2]
        bad = np.zeros(40, bool)[::2]
        bad[3] = True
        index_out, valid_out = np.empty(20, np.int64), np.empty(20, bool)
        assert batch_rows(indices, valid, bad, index_out, valid_out) == 19
        assert np.array_equal(index_out, indices) and valid_out.tolist() == [k != 3 for k in range(20)]
    finally:
        _native.kernels.cache_clear()

