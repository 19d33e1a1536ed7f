"""bucketize() against an independent reference: bisect / a plain loop over Python numbers.

README: ``bucketize(x, boundaries)`` is ``numpy.digitize(x, boundaries, right=False)``; NaN goes to
``len(boundaries)`` for increasing boundaries (0 for decreasing); ``x`` and ``boundaries`` are compared
in ``numpy.result_type`` of the two; boundaries containing NaN or not monotone are rejected.
"""

from __future__ import annotations

import bisect
import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from feedline.ops import bucketize

INF, NAN = math.inf, math.nan


def _python_values(array: np.ndarray, common: np.dtype) -> list:
    """Elements as exact Python numbers in the comparison type ``common``.

    Float comparisons: float32 and float64 values are exact Python floats; integers become the
    nearest float64 (``float(int)`` rounds half to even, as a C cast does). Python compares floats
    exactly, so comparing the float64 forms equals comparing in float32 when both are float32.
    Integer comparisons: exact Python ints.
    """
    values = array.ravel().tolist()
    if common.kind == "f":
        assert common.itemsize >= 4, "reference covers float32/float64 comparisons only"
        return [float(v) for v in values]
    return [int(v) for v in values]


def reference(x, boundaries) -> np.ndarray:
    """numpy.digitize(x, boundaries, right=False) as the README defines it, one value at a time."""
    x = np.asarray(x)
    b = np.asarray(boundaries)
    common = np.result_type(x.dtype, b.dtype)
    xs, bs = _python_values(x, common), _python_values(b, common)
    increasing = all(p <= q for p, q in pairwise(bs))
    decreasing = all(p >= q for p, q in pairwise(bs))
    assert increasing or decreasing, "reference needs monotone boundaries"
    out = []
    for v in xs:
        if math.isnan(v):  # NaN sorts after everything
            out.append(len(bs) if increasing else 0)
        elif increasing:  # boundaries[i-1] <= v < boundaries[i]
            out.append(bisect.bisect_right(bs, v))
        else:  # decreasing: boundaries[i-1] > v >= boundaries[i]
            i = 0
            while i < len(bs) and bs[i] > v:
                i += 1
            out.append(i)
    return np.array(out, dtype=np.int64).reshape(x.shape)


def check(x, boundaries):
    got = bucketize(x, boundaries)
    expected = reference(x, boundaries)
    assert isinstance(got, np.ndarray) and got.dtype == np.int64
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected, err_msg=f"x={x!r}\nboundaries={boundaries!r}")
    return got


def test_reference_itself():
    """The reference's own rules, on values worked out by hand."""
    b = [1.0, 2.0, 2.0, 3.0]
    x = [NAN, 0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, -INF, INF]
    assert reference(x, b).tolist() == [4, 0, 1, 1, 3, 3, 4, 4, 0, 4]
    assert reference(x, b[::-1]).tolist() == [0, 4, 3, 3, 1, 1, 0, 0, 4, 0]
    assert reference([-0.0, 0.0], [0.0]).tolist() == [1, 1]
    assert reference(np.float32([0.1]), np.float64([0.1])).tolist() == [1]  # float32(0.1) > 0.1
    assert reference(np.int64([2**53 + 1]), np.float64([2.0**53])).tolist() == [1]


# --- hand-picked cases --------------------------------------------------------------------------

FLOATS = [np.float32, np.float64]


@pytest.mark.parametrize("xdt", FLOATS)
@pytest.mark.parametrize("bdt", FLOATS)
def test_nan_goes_last_for_increasing_and_first_for_decreasing(xdt, bdt):
    x = np.array([NAN, -NAN, 0.0], dtype=xdt)
    b = np.array([-1.0, 0.0, 5.0], dtype=bdt)
    assert check(x, b).tolist() == [3, 3, 2]
    assert check(x, b[::-1].copy()).tolist() == [0, 0, 1]
    assert check(x, b[:1]).tolist() == [1, 1, 1]
    assert check(x, np.array([], dtype=bdt)).tolist() == [0, 0, 0]


@pytest.mark.parametrize("xdt", FLOATS)
@pytest.mark.parametrize("bdt", FLOATS)
def test_signed_zeros_at_a_boundary(xdt, bdt):
    tiny = float(np.finfo(xdt).smallest_subnormal)
    x = np.array([-0.0, 0.0, -tiny, tiny], dtype=xdt)
    for zero in (0.0, -0.0):
        b = np.array([zero], dtype=bdt)
        assert check(x, b).tolist() == [1, 1, 0, 1]  # -0.0 == +0.0: both at the boundary
        both = np.array([-1.0, zero, 1.0], dtype=bdt)
        assert check(x, both).tolist() == [2, 2, 1, 2]
        assert check(x, both[::-1].copy()).tolist() == [1, 1, 2, 1]
    check(x, np.array([-0.0, 0.0], dtype=bdt))
    check(x, np.array([0.0, -0.0], dtype=bdt))


@pytest.mark.parametrize("xdt", FLOATS)
@pytest.mark.parametrize("bdt", FLOATS)
def test_values_equal_to_boundaries_and_their_neighbours(xdt, bdt):
    b = np.array([-3.5, -1.0, 0.0, 0.0, 2.0, 2.0, 2.0, 7.25, 1e30], dtype=bdt)
    as_x = b.astype(xdt)
    x = np.concatenate([as_x, np.nextafter(as_x, xdt(-INF)), np.nextafter(as_x, xdt(INF))])
    got = check(x, b)
    assert got[:9].tolist() == [1, 2, 4, 4, 7, 7, 7, 8, 9]  # at a boundary: after all its repeats
    check(x, b[::-1].copy())


@pytest.mark.parametrize("xdt", FLOATS)
@pytest.mark.parametrize("bdt", FLOATS)
def test_infinities(xdt, bdt):
    x = np.array([-INF, INF, 0.0, np.finfo(xdt).max, -np.finfo(xdt).max], dtype=xdt)
    assert check(x, np.array([0.0], dtype=bdt)).tolist() == [0, 1, 1, 1, 0]
    b = np.array([-INF, 0.0, INF], dtype=bdt)
    assert check(x, b).tolist() == [1, 3, 2, 2, 1]
    assert check(x, b[::-1].copy()).tolist() == [2, 0, 1, 1, 2]
    assert check(x, np.array([INF, INF], dtype=bdt)).tolist() == [0, 2, 0, 0, 0]


def test_compared_in_the_common_type():
    # float32 x against float64 boundaries compares in float64: float32(0.1) is above 0.1.
    assert check(np.float32([0.1, 0.2]), np.float64([0.1, 0.2])).tolist() == [1, 2]
    assert check(np.float64([0.1]), np.float32([0.1])).tolist() == [0]
    # int64 against float64: the int rounds to float64 first (2**53 + 1 -> 2**53).
    assert check(np.int64([2**53, 2**53 + 1, 2**53 + 2]), np.float64([2.0**53 + 1])).tolist() == [1, 1, 1]
    assert check(np.int64([2**53 + 3]), np.float64([2.0**53 + 4])).tolist() == [1]
    # int64 against uint64 compares in float64; uint64 against uint64 exactly.
    check(np.int64([-1, 2**62, 2**63 - 1]), np.uint64([0, 2**63, 2**64 - 1]))
    assert check(np.uint64([2**64 - 1, 2**64 - 2]), np.uint64([2**64 - 1])).tolist() == [1, 0]
    # int32 against float32 compares in float64, int16 against float32 in float32 (both exact).
    assert check(np.int32([16777217]), np.float32([16777216.0])).tolist() == [1]
    check(np.int16([-7, 0, 300]), np.float32([-6.5, 0.0, 300.0]))
    check(np.array([True, False]), np.int8([0, 1]))


@pytest.mark.parametrize("xdt", [np.float32, np.float64, np.int64])
def test_empty_inputs(xdt):
    for shape in [(0,), (3, 0), (0, 2)]:
        x = np.empty(shape, dtype=xdt)
        out = check(x, [1.0, 2.0])
        assert out.shape == shape
        assert check(x, np.array([], dtype=np.float64)).shape == shape
    x = np.array([[-1, 5, 0], [2, 3, 9]], dtype=xdt)
    assert check(x, np.array([], dtype=np.float64)).tolist() == [[0, 0, 0], [0, 0, 0]]
    assert check(x, np.array([], dtype=np.float32)).tolist() == [[0, 0, 0], [0, 0, 0]]


def test_one_boundary_and_shapes():
    x = np.arange(-2, 4, dtype=np.float64).reshape(2, 3)
    assert check(x, [0.0]).tolist() == [[0, 0, 1], [1, 1, 1]]
    assert check(np.arange(6).reshape(2, 3), [2]).tolist() == [[0, 0, 1], [1, 1, 1]]
    assert int(bucketize(np.float32(2.0), np.float32([2.0]))) == 1
    assert check([0.5, 1.5], [1]).tolist() == [0, 1]  # Python lists


def test_zero_d_input_gives_a_zero_d_array():
    """As hash_buckets and the CuPy path (cp.empty(x.shape)) give, not np.digitize's NumPy scalar."""
    check(np.array(2.0), np.float64([1.0, 3.0]))


# --- generated cases ----------------------------------------------------------------------------

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, INF, -INF, NAN, 1e-45, -1e-45, 3.4e38, 1e300, -1e300]


@st.composite
def float_case(draw):
    xdt = draw(st.sampled_from(FLOATS))
    bdt = draw(st.sampled_from(FLOATS))
    bwidth = 32 if bdt == np.float32 else 64
    some = st.floats(allow_nan=False, width=bwidth) | st.sampled_from([v for v in SPECIAL if not math.isnan(v)])
    with np.errstate(over="ignore"):  # float64 values beyond float32's range become +-inf
        b = np.sort(np.array(draw(st.lists(some, max_size=10)), dtype=bdt))
    if draw(st.booleans()):
        b = b[::-1].copy()
    anything = st.floats(width=32 if xdt == np.float32 else 64) | st.sampled_from(SPECIAL)
    if b.size:  # boundary values (rounded to x's dtype) and their neighbours
        near = st.tuples(st.integers(0, b.size - 1), st.sampled_from([-INF, 0, INF]))
        anything = anything | near
    items = draw(st.lists(anything, max_size=40))
    with np.errstate(over="ignore"):
        values = []
        for item in items:
            if isinstance(item, tuple):
                v = np.array(b[item[0]], dtype=xdt)
                values.append(v if item[1] == 0 else np.nextafter(v, xdt(item[1])))
            else:
                values.append(np.array(item, dtype=xdt))
    return np.array(values, dtype=xdt), b


@settings(max_examples=300, deadline=None)
@given(float_case())
def test_floats_match_reference(case):
    x, b = case
    check(x, b)


INT_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.uint32, np.int64, np.uint64]
BOUND_DTYPES = INT_DTYPES[1:] + [np.float32, np.float64]


def _values_of(dtype, draw, max_size):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.array(draw(st.lists(st.booleans(), max_size=max_size)), dtype=dtype)
    if dtype.kind == "f":
        width = 8 * dtype.itemsize
        floats = st.floats(allow_nan=False, width=width) | st.sampled_from(
            [2.0**53, 2.0**53 + 2, 2.0**63, -(2.0**63), 2.0**64, 0.5, -0.0])
        return np.array(draw(st.lists(floats, max_size=max_size)), dtype=dtype)
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max)) | st.sampled_from(
        [v for v in (int(info.min), int(info.max), 0, 2**53 + 1, 2**53 + 3, 2**63 - 1, 2**63 + 1)
         if info.min <= v <= info.max])
    return np.array(draw(st.lists(ints, max_size=max_size)), dtype=dtype)


@st.composite
def int_case(draw):
    xdt = draw(st.sampled_from(INT_DTYPES))
    bdt = draw(st.sampled_from(BOUND_DTYPES))
    b = np.sort(_values_of(bdt, draw, 8))
    if draw(st.booleans()):
        b = b[::-1].copy()
    x = _values_of(xdt, draw, 30)
    if b.size and draw(st.booleans()):  # the boundaries themselves, where x's dtype holds them
        lo, hi = (0, 1) if np.dtype(xdt).kind == "b" else (int(np.iinfo(xdt).min), int(np.iinfo(xdt).max))
        exact = [int(v) for v in b.tolist() if math.isfinite(v) and float(v).is_integer()]
        x = np.concatenate([x, np.array([v for v in exact if lo <= v <= hi], dtype=xdt)])
    return x, b


@settings(max_examples=300, deadline=None)
@given(int_case())
def test_integers_and_mixed_types_match_reference(case):
    x, b = case
    check(x, b)


# --- rejected arguments -------------------------------------------------------------------------

@pytest.mark.parametrize("bdt", FLOATS)
def test_nan_boundaries_are_rejected(bdt):
    for bounds in ([NAN], [NAN, 1.0], [0.0, NAN, 2.0], [0.0, 1.0, NAN], [NAN, NAN], [2.0, NAN, 0.0]):
        b = np.array(bounds, dtype=bdt)
        for x in (np.float32([1.0]), np.float64([NAN]), np.int64([1]), np.array([], dtype=np.float64)):
            with pytest.raises(ValueError, match="NaN"):
                bucketize(x, b)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False), max_size=8), st.integers(0, 8), st.sampled_from(FLOATS))
def test_any_nan_in_boundaries_is_rejected(values, where, bdt):
    values.insert(min(where, len(values)), NAN)
    with np.errstate(over="ignore"):
        b = np.array(values, dtype=bdt)
    with pytest.raises(ValueError, match="NaN"):
        bucketize(np.float64([0.0, 1.0]), b)


def test_non_monotone_boundaries_are_rejected():
    for bounds in ([1.0, 3.0, 2.0], [3.0, 1.0, 2.0], [0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0],
                   [-INF, INF, -INF], [0.0, -1.0, -0.0, 1.0]):
        for bdt in FLOATS:
            with pytest.raises(ValueError, match="monotonically"):
                bucketize(np.float64([1.0]), np.array(bounds, dtype=bdt))
    with pytest.raises(ValueError, match="monotonically"):
        bucketize(np.int64([1]), np.int64([5, 2, 9]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(allow_nan=False) | st.integers(-5, 5).map(float), min_size=3, max_size=8))
def test_any_non_monotone_boundaries_are_rejected(values):
    pairs = list(pairwise(values))
    assume(not all(p <= q for p, q in pairs) and not all(p >= q for p, q in pairs))
    with pytest.raises(ValueError, match="monotonically"):
        bucketize(np.float64([0.0]), np.array(values))


def test_monotone_boundaries_with_repeats_are_accepted():
    for bounds in ([1.0, 1.0, 1.0], [0.0, -0.0, 0.0], [2.0, 2.0, 1.0, 1.0], [-INF, -INF, INF]):
        check(np.float64([0.0, 1.0, 2.0, NAN, INF]), np.array(bounds))


def test_bad_arguments():
    with pytest.raises(ValueError, match="monotonically"):
        bucketize([1.0], [1.0, 3.0, 2.0])
    with pytest.raises(ValueError, match="NaN"):
        bucketize([1.0], [1.0, np.nan])
    with pytest.raises(ValueError, match="1-D"):
        bucketize([1.0], [[1.0]])
    with pytest.raises(ValueError, match="1-D"):
        bucketize([1.0], 1.0)
    with pytest.raises(TypeError, match="x must .* got dtype complex128"):
        bucketize(np.array([1j]), [1.0])
    with pytest.raises(TypeError, match="boundaries must"):
        bucketize([1.0], np.array(["a"]))
