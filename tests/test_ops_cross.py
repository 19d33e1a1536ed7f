"""cross(): murmur3 over a_le8 || b_le8, modulo num_buckets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.utils import murmurhash3_32 as sk_murmur3

from feedline.ops import cross

int64s = st.integers(-(2**63), 2**63 - 1)


def reference(a: int, b: int, num_buckets: int, seed: int) -> int:
    key = a.to_bytes(8, "little", signed=True) + b.to_bytes(8, "little", signed=True)
    return sk_murmur3(key, seed, positive=True) % num_buckets


def test_golden_values_are_stable():
    a = np.array([0, 1, -1, 10, 2**40], dtype=np.int64)
    b = np.array([0, 2, 7, 20, -5], dtype=np.int64)
    pinned = [reference(int(x), int(y), 1_000_003, 0) for x, y in zip(a, b)]
    assert pinned == [714963, 598449, 307853, 19005, 607298]
    assert cross(a, b, 1_000_003).tolist() == pinned
    assert cross(a, b, 2**32 - 1, seed=42).tolist() == [
        reference(int(x), int(y), 2**32 - 1, 42) for x, y in zip(a, b)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(int64s, int64s), max_size=40), st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_matches_sklearn_reference(pairs, num_buckets, seed):
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    assert cross(a, b, num_buckets, seed).tolist() == [reference(x, y, num_buckets, seed) for x, y in pairs]


def test_order_sensitive():
    a = np.arange(1000, dtype=np.int64)
    b = a + 1
    assert (cross(a, b, 2**32 - 1) != cross(b, a, 2**32 - 1)).mean() > 0.99


def test_narrow_types_widen_to_int64():
    a32 = np.array([-3, 0, 5], dtype=np.int32)
    b32 = np.array([7, -1, 2**31 - 1], dtype=np.int32)
    np.testing.assert_array_equal(cross(a32, b32, 977), cross(a32.astype(np.int64), b32.astype(np.int64), 977))
    u = np.array([2**64 - 1], dtype=np.uint64)
    assert cross(u, u, 977).tolist() == [reference(-1, -1, 977, 0)]
    large = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 70_000, dtype=np.int64)
    expected = [reference(int(x), int(y), 977, 3) for x, y in zip(large[-5:], large[4::-1])]
    assert cross(large, large[::-1], 977, 3)[-5:].tolist() == expected


def test_bad_arguments():
    a = np.arange(3)
    with pytest.raises(ValueError, match="same shape"):
        cross(a, np.arange(4), 10)
    with pytest.raises(TypeError, match="a must have dtype .* got dtype float64"):
        cross(a.astype(float), a, 10)
    with pytest.raises(TypeError, match="b must have dtype"):
        cross(a, a.astype(np.int8), 10)
    with pytest.raises(ValueError, match="num_buckets"):
        cross(a, a, -1)
    with pytest.raises(ValueError, match="seed"):
        cross(a, a, 10, seed=2**33)
