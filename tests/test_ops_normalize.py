"""normalize_dense() against an independent float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from feedline.ops import normalize_dense
from feedline.ops.log1p64 import log1p_float32


def reference(x, fill, clip, log):
    y = np.asarray(x, dtype=np.float32).astype(np.float64)
    y = np.where(np.isnan(y), np.float64(np.float32(fill)), y)
    if clip is not None:
        y = np.maximum(y, np.float64(np.float32(clip)))
    with np.errstate(all="ignore"):
        return (np.log1p(y) if log else y).astype(np.float32)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return np.abs(ordered(a) - ordered(b))


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays(np.float32, st.integers(0, 200), elements=st.floats(width=32, allow_nan=True)),
    st.floats(-0.5, 100, width=32),
    st.one_of(st.none(), st.floats(-0.75, 10, width=32)),
)
def test_matches_float64_reference_within_one_ulp(x, fill, clip):
    out = normalize_dense(x, fill_value=fill, clip_min=clip)
    ref = reference(x, fill, clip, True)
    assert out.dtype == np.float32 and out.shape == x.shape
    both_nan = np.isnan(out) & np.isnan(ref)
    assert (np.isnan(out) == np.isnan(ref)).all()
    assert (ulp_distance(out[~both_nan], ref[~both_nan]) <= 1).all()


def test_log1p_almost_always_correctly_rounded():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2**31, 2_000_000, dtype=np.int64).astype(np.uint32).view(np.float32)
    y = y[np.isfinite(y)]
    out = log1p_float32(y)
    ref = np.log1p(y.astype(np.float64)).astype(np.float32)
    assert ulp_distance(out, ref).max() <= 1
    assert (out != ref).sum() <= 2


def test_special_values_and_defaults():
    x = np.array([np.nan, -5.0, -0.0, 0.0, 1.0, np.inf, 1e-40], dtype=np.float32)
    out = normalize_dense(x)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0, np.float32(np.log(2.0)), np.inf, np.float32(1e-40)]
    no_clip = normalize_dense(np.array([-1.0, -2.0, -np.inf, np.nan], np.float32), clip_min=None)
    assert no_clip[0] == -np.inf
    assert no_clip[1:3].view(np.uint32).tolist() == [0x7FC00000] * 2
    assert no_clip[3] == 0.0
    plain = normalize_dense(np.array([np.nan, -2.0, 3.0], np.float32), fill_value=7.0, clip_min=-1.0, log=False)
    assert plain.tolist() == [7.0, -1.0, 3.0]
    kept_nan = normalize_dense(np.array([np.nan], np.float32), fill_value=float("nan"))
    assert kept_nan.view(np.uint32).tolist() == [0x7FC00000]


def test_input_is_not_modified_and_other_dtypes_convert():
    x = np.array([[np.nan, 3.0], [-1.0, 2.0]], dtype=np.float32)
    before = x.copy()
    out = normalize_dense(x)
    np.testing.assert_array_equal(x, before)
    np.testing.assert_array_equal(normalize_dense(x.astype(np.float64)), out)
    np.testing.assert_array_equal(normalize_dense(np.array([0, 3], np.int64)), normalize_dense(np.array([0, 3], np.float32)))
    np.testing.assert_array_equal(normalize_dense(x.T), out.T)


def test_bad_arguments():
    x = np.zeros(2, np.float32)
    with pytest.raises(TypeError, match="x must .* got dtype bool"):
        normalize_dense(np.zeros(2, bool))
    with pytest.raises(TypeError, match="fill_value must be a float, got str"):
        normalize_dense(x, fill_value="0")
    with pytest.raises(ValueError, match="clip_min must not be NaN"):
        normalize_dense(x, clip_min=float("nan"))
    with pytest.raises(TypeError, match="log must be a bool"):
        normalize_dense(x, log="yes")
