"""bucketize() equals numpy.digitize(x, boundaries, right=False)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from feedline.ops import bucketize

finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)
xs = hnp.arrays(np.float32, st.integers(0, 60), elements=st.one_of(finite, st.just(float("nan"))))
bounds = st.lists(st.sampled_from([-5.0, -1.0, 0.0, 0.5, 1.0, 3.0, 1e5]) | finite, max_size=12)


@settings(max_examples=150, deadline=None)
@given(xs, bounds, st.booleans())
def test_matches_digitize(x, boundaries, descending):
    b = np.sort(np.array(boundaries, dtype=np.float64))
    if descending:
        b = b[::-1]
    out = bucketize(x, b)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.digitize(x, b, right=False))


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.int64, st.integers(0, 40), elements=st.integers(-(2**62), 2**62)),
       st.lists(st.integers(-(2**62), 2**62), max_size=8))
def test_integers_match_digitize(x, boundaries):
    b = np.sort(np.array(boundaries, dtype=np.int64))
    np.testing.assert_array_equal(bucketize(x, b), np.digitize(x, b))
    np.testing.assert_array_equal(bucketize(x, b.astype(np.float64)), np.digitize(x, b.astype(np.float64)))


def test_edges_nan_repeats_and_empty():
    b = [1.0, 2.0, 2.0, 3.0]
    x = np.array([np.nan, 0.0, 1.0, 2.0, 2.5, 3.0, 4.0, -np.inf, np.inf])
    assert bucketize(x, b).tolist() == [4, 0, 1, 3, 3, 4, 4, 0, 4]
    assert bucketize(x, b[::-1]).tolist() == np.digitize(x, b[::-1]).tolist()
    assert bucketize(np.array([], dtype=np.float32), b).shape == (0,)
    assert bucketize(x, []).tolist() == [0] * x.shape[0]
    assert bucketize(np.arange(6).reshape(2, 3), [2]).tolist() == [[0, 0, 1], [1, 1, 1]]


def test_bad_arguments():
    with pytest.raises(ValueError, match="monotonically"):
        bucketize([1.0], [1.0, 3.0, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        bucketize([1.0], [1.0, np.nan])
    with pytest.raises(ValueError, match="1-D"):
        bucketize([1.0], [[1.0]])
    with pytest.raises(TypeError, match="x must .* got dtype complex128"):
        bucketize(np.array([1j]), [1.0])
    with pytest.raises(TypeError, match="boundaries must"):
        bucketize([1.0], np.array(["a"]))
