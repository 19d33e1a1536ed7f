"""multi_hot() and keyed_jagged(): jagged layout, truncation, empty rows, key-major order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.ops import Jagged, Strings, hash_buckets, keyed_jagged, multi_hot

rows_strategy = st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), max_size=12)


def arrow_layout(rows):
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    return offsets, values


@settings(max_examples=80, deadline=None)
@given(rows_strategy, st.one_of(st.none(), st.integers(1, 4)), st.integers(1, 1000), st.integers(0, 2**32 - 1))
def test_round_trip_and_truncation(rows, max_len, num_buckets, seed):
    offsets, values = arrow_layout(rows)
    out = multi_hot(offsets, values, num_buckets, seed=seed, max_len=max_len)
    kept = [r if max_len is None else r[:max_len] for r in rows]
    assert out.lengths.dtype == np.int32 and out.values.dtype == np.int64 and out.offsets.dtype == np.int64
    assert out.lengths.tolist() == [len(r) for r in kept]
    assert out.offsets.tolist() == [0, *np.cumsum([len(r) for r in kept]).tolist()]
    for i, row in enumerate(kept):
        got = out.values[out.offsets[i] : out.offsets[i + 1]]
        np.testing.assert_array_equal(got, hash_buckets(np.array(row, dtype=np.int64), num_buckets, seed))


def test_empty_rows_and_offsets_not_starting_at_zero():
    values = np.arange(10, dtype=np.int32)
    out = multi_hot(np.array([2, 2, 5, 5], dtype=np.int32), values, 50, max_len=2)
    assert out.lengths.tolist() == [0, 2, 0]
    assert out.offsets.tolist() == [0, 0, 2, 2]
    np.testing.assert_array_equal(out.values, hash_buckets(values[2:4], 50))
    empty = multi_hot(np.array([0]), np.zeros(0, np.int64), 50)
    assert empty.values.shape == (0,) and empty.lengths.shape == (0,) and empty.offsets.tolist() == [0]


def test_string_values():
    words = ["a", "bb", "ccc", "dddd", "e"]
    out = multi_hot([0, 3, 3, 5], words, 1000, seed=4, max_len=2)
    expected = hash_buckets(Strings.from_pylist(["a", "bb", "dddd", "e"]), 1000, seed=4)
    np.testing.assert_array_equal(out.values, expected)
    assert out.lengths.tolist() == [2, 0, 2]
    sliced = multi_hot([1, 4, 5], words, 1000, seed=4, max_len=2)
    expected = hash_buckets(["bb", "ccc", "e"], 1000, seed=4)
    np.testing.assert_array_equal(sliced.values, expected)
    np.testing.assert_array_equal(multi_hot([1, 4], words, 1000, seed=4).values,
                                  hash_buckets(words[1:4], 1000, seed=4))


def test_keyed_jagged_is_key_major():
    f0 = multi_hot([0, 2, 3], np.array([1, 2, 3]), 100)
    f1 = multi_hot([0, 0, 1], np.array([4]), 100)
    f2 = multi_hot([0, 1, 2], np.array([5, 6]), 100)
    kjt = keyed_jagged([f0, f1, f2])
    assert kjt.lengths.tolist() == [2, 1, 0, 1, 1, 1]
    assert kjt.offsets.tolist() == [0, 2, 3, 3, 4, 5, 6]
    np.testing.assert_array_equal(kjt.values, np.concatenate([f0.values, f1.values, f2.values]))
    assert keyed_jagged([f1]).lengths.tolist() == [0, 1]


def test_bad_arguments():
    values = np.arange(4)
    with pytest.raises(ValueError, match="offsets must be non-decreasing"):
        multi_hot([0, 3, 2], values, 10)
    with pytest.raises(ValueError, match=r"offsets must lie in \[0, 4\]"):
        multi_hot([0, 5], values, 10)
    with pytest.raises(ValueError, match=r"offsets must lie"):
        multi_hot([-1, 2], values, 10)
    with pytest.raises(ValueError, match="at least one entry"):
        multi_hot(np.array([], np.int64), values, 10)
    with pytest.raises(ValueError, match="max_len must be a positive int"):
        multi_hot([0, 4], values, 10, max_len=0)
    with pytest.raises(TypeError, match="values must have dtype .* got dtype float64"):
        multi_hot([0, 1], [1.5], 10)
    with pytest.raises(ValueError, match="num_buckets"):
        multi_hot([0, 4], values, 0)
    f = multi_hot([0, 1], values[:1], 10)
    g = multi_hot([0, 1, 2], values[:2], 10)
    with pytest.raises(ValueError, match="same number of rows"):
        keyed_jagged([f, g])
    with pytest.raises(ValueError, match="at least one"):
        keyed_jagged([])
    with pytest.raises(TypeError, match=r"features\[0\] must be a Jagged"):
        keyed_jagged([values])
    with pytest.raises(TypeError, match="lengths must be a 1-D int32"):
        Jagged(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="offsets must have len"):
        Jagged(np.zeros(0, np.int64), np.zeros(2, np.int32), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="inconsistent"):
        keyed_jagged([Jagged(np.zeros(0, np.int64), np.ones(1, np.int32), np.array([0, 1]))])


def test_a_jagged_of_checked_parts_checks_its_values_and_is_a_jagged():
    """``Jagged.of_checked`` (a batch's sparse output, lengths and offsets a stage's own constants): the same
    ``Jagged``; values that are not 1-D int64 NumPy, or parts not NumPy, get the full checks and their errors."""
    lengths, offsets = np.ones(3, np.int32), np.arange(4, dtype=np.int64)
    values = np.arange(3, dtype=np.int64)
    made = Jagged.of_checked(values, lengths, offsets)
    assert made == Jagged(values, lengths, offsets) and made.values is values and made.num_rows == 3
    with pytest.raises(TypeError, match="values must be a 1-D int64 array"):
        Jagged.of_checked(values.astype(np.int32), lengths, offsets)
    with pytest.raises(TypeError, match="values must be a 1-D int64 array"):
        Jagged.of_checked(values.reshape(1, 3), lengths, offsets)
    with pytest.raises(TypeError, match="lengths must be a 1-D int32 array"):
        Jagged.of_checked(values, [1, 1, 1], offsets)
    with pytest.raises(AttributeError):  # frozen, as a Jagged made the usual way
        made.values = values
