"""murmur3_32 / hash_buckets against sklearn's MurmurHash3 over the little-endian key bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.utils import murmurhash3_32 as sk_murmur3

from feedline.ops import Strings, hash_buckets, murmur3_32
from feedline.ops._murmur3_words import CHUNK_ROWS

seeds = st.integers(0, 2**32 - 1)
buckets = st.integers(1, 2**32 - 1)


def reference(values, nbytes: int, seed: int) -> list[int]:
    return [sk_murmur3(int(v).to_bytes(nbytes, "little", signed=v < 0), seed, positive=True) for v in values]


def test_golden_int64():
    assert murmur3_32(np.array([10], dtype=np.int64)).tolist() == [4004982076]
    assert murmur3_32(np.array([10], dtype=np.int64), seed=42).tolist() == [4279022973]
    assert hash_buckets(np.array([10], dtype=np.int64), 1000).tolist() == [4004982076 % 1000]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50), seeds, buckets)
def test_int64_matches_sklearn(values, seed, num_buckets):
    keys = np.array(values, dtype=np.int64)
    expected = reference(values, 8, seed)
    assert murmur3_32(keys, seed).tolist() == expected
    assert hash_buckets(keys, num_buckets, seed).tolist() == [h % num_buckets for h in expected]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=30), seeds)
def test_uint64_matches_sklearn(values, seed):
    keys = np.array(values, dtype=np.uint64)
    assert murmur3_32(keys, seed).tolist() == reference(values, 8, seed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=50), seeds, buckets)
def test_int32_matches_sklearn(values, seed, num_buckets):
    keys = np.array(values, dtype=np.int32)
    expected = reference(values, 4, seed)
    assert murmur3_32(keys, seed).tolist() == expected
    assert hash_buckets(keys, num_buckets, seed).tolist() == [h % num_buckets for h in expected]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=30), seeds)
def test_uint32_matches_sklearn(values, seed):
    assert murmur3_32(np.array(values, dtype=np.uint32), seed).tolist() == reference(values, 4, seed)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=30), seeds, buckets)
def test_strings_match_sklearn(words, seed, num_buckets):
    expected = [sk_murmur3(w.encode("utf-8"), seed, positive=True) for w in words]
    assert murmur3_32(Strings.from_pylist(words), seed).tolist() == expected
    if words:
        assert murmur3_32(words, seed).tolist() == expected
        assert murmur3_32(pa.array(words, pa.large_string()), seed).tolist() == expected
    assert hash_buckets(pa.array(words, pa.string()), num_buckets, seed).tolist() == [
        h % num_buckets for h in expected
    ]


def test_strings_from_sliced_and_chunked_arrow():
    words = ["", "a", "bb", "ccc", "dddd", "eeeee", "ünï", "🎉🎉"]
    expected = np.array([sk_murmur3(w.encode(), 3, positive=True) for w in words], dtype=np.uint32)
    np.testing.assert_array_equal(murmur3_32(pa.array(words)[3:], 3), expected[3:])
    np.testing.assert_array_equal(murmur3_32(pa.chunked_array([words[:2], words[2:]]), 3), expected)
    offsets = np.array([0, 1, 3], dtype=np.int32)
    np.testing.assert_array_equal(
        murmur3_32(Strings(offsets, np.frombuffer(b"abb", np.uint8)), 3), expected[1:3]
    )


def test_long_strings_and_one_long_among_short():
    words = ["x" * 1001, "", "ab", "y" * 17]
    expected = [sk_murmur3(w.encode(), 0, positive=True) for w in words]
    assert murmur3_32(words).tolist() == expected


@pytest.mark.parametrize("num_buckets", [1, 2, 1 << 20, 1_000_003, 2**32 - 1])
def test_buckets_are_hash_modulo_across_chunks(num_buckets):
    keys = np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 2 * CHUNK_ROWS + 7, dtype=np.int64)
    hashes = murmur3_32(keys, 5).astype(np.int64)
    np.testing.assert_array_equal(hash_buckets(keys, num_buckets, 5), hashes % num_buckets)
    sample = slice(CHUNK_ROWS - 3, CHUNK_ROWS + 3)
    assert hashes[sample].tolist() == reference(keys[sample].tolist(), 8, 5)


def test_shape_dtype_and_layout_are_kept():
    keys = np.arange(24, dtype=np.int64).reshape(4, 6)
    out = hash_buckets(keys, 97)
    assert out.shape == (4, 6) and out.dtype == np.int64
    np.testing.assert_array_equal(out.T, hash_buckets(keys.T, 97))
    np.testing.assert_array_equal(out[:, ::2], hash_buckets(keys[:, ::2], 97))
    np.testing.assert_array_equal(hash_buckets(keys.astype(">i8"), 97), out)
    assert murmur3_32(keys).dtype == np.uint32
    assert hash_buckets([], 10).shape == (0,)
    assert murmur3_32(np.int64(10)).shape == () and int(murmur3_32(np.int64(10))) == 4004982076
    assert hash_buckets(Strings.from_pylist([]), 10).shape == (0,)


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"num_buckets": 0}, ValueError, ["num_buckets", "got 0"]),
        ({"num_buckets": 2**32}, ValueError, ["num_buckets"]),
        ({"num_buckets": 10.0}, TypeError, ["num_buckets", "float"]),
        ({"num_buckets": True}, TypeError, ["num_buckets", "bool"]),
        ({"num_buckets": 10, "seed": -1}, ValueError, ["seed", "-1"]),
        ({"num_buckets": 10, "seed": 2**32}, ValueError, ["seed"]),
        ({"num_buckets": 10, "seed": "1"}, TypeError, ["seed", "str"]),
    ],
)
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        hash_buckets(np.arange(3), **kwargs)
    assert all(w in str(info.value) for w in words)


@pytest.mark.parametrize("dtype", [np.int16, np.uint8, np.float64, np.bool_])
def test_unsupported_dtype_names_dtype(dtype):
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        murmur3_32(np.zeros(3, dtype=dtype))


def test_bad_strings():
    data = np.frombuffer(b"abc", np.uint8)
    with pytest.raises(ValueError, match="non-decreasing"):
        Strings(np.array([0, 2, 1]), data)
    with pytest.raises(ValueError, match=r"offsets must lie in \[0, 3\]"):
        Strings(np.array([0, 4]), data)
    with pytest.raises(TypeError, match="data must be a 1-D uint8"):
        Strings(np.array([0, 1]), np.zeros(3, np.int32))
    with pytest.raises(TypeError, match="offsets must be an int32 or int64"):
        Strings(np.array([0.0, 1.0]), data)
    with pytest.raises(ValueError, match="nulls"):
        murmur3_32(pa.array(["a", None]))
    with pytest.raises(TypeError, match=r"items\[1\]"):
        Strings.from_pylist(["a", 3])
    with pytest.raises(TypeError, match="float64"):
        murmur3_32(pa.array([1, None]))


def test_arrow_integer_arrays_hash_as_integers():
    np.testing.assert_array_equal(murmur3_32(pa.array([1, 10], pa.int64())), murmur3_32(np.array([1, 10])))
