"""The CuPy code paths of feedline.ops, run without a GPU (``emulated_gpu``: the kernels compiled as plain C++
from exactly the text NVRTC would get, each launch's arguments checked against the kernel's C signature);
results must equal the NumPy paths bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from feedline import ops

import cuda_kernels as ck
from emulated_gpu import CXX, dev, gpu, kernels, same_bits  # noqa: F401  (fixtures)

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ not found")

rng = np.random.default_rng(99)


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32])
def test_hash_fixed(gpu, dtype):
    info = np.iinfo(dtype)
    keys = rng.integers(info.min, info.max, 5000, dtype=dtype, endpoint=True).reshape(50, 100)
    same_bits(ops.murmur3_32(dev(keys), 42), ops.murmur3_32(keys, 42))
    same_bits(ops.hash_buckets(dev(keys), 1_000_003, 3), ops.hash_buckets(keys, 1_000_003, 3))
    assert set(gpu) == {f"fl_murmur3_hash_u{keys.itemsize * 8}", f"fl_murmur3_bucket_u{keys.itemsize * 8}"}


def test_hash_strings(gpu):
    words = ops.Strings.from_pylist(["", "a", "ab", "abc", "abcd", "ünï🎉", "x" * 33])
    device_words = ops.Strings(dev(words.offsets.astype(np.int32)), dev(words.data))
    same_bits(ops.murmur3_32(device_words, 5), ops.murmur3_32(words, 5))
    same_bits(ops.hash_buckets(device_words.slice(2, 6), 97, 5), ops.hash_buckets(words.slice(2, 6), 97, 5))


def test_cross(gpu):
    a = rng.integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64)
    b = rng.integers(0, 2**32 - 1, 3000, dtype=np.uint32)
    same_bits(ops.cross(dev(a), dev(b), 977, 1), ops.cross(a, b, 977, 1))
    assert gpu == ["fl_cross_bucket"]


@pytest.mark.parametrize("x_dtype,b_dtype", [(np.float32, np.float32), (np.float32, np.float64),
                                             (np.int64, np.float64), (np.int64, np.int64),
                                             (np.uint64, np.uint64), (np.int32, np.uint32), (np.bool_, np.int8)])
@pytest.mark.parametrize("descending", [False, True])
def test_bucketize(gpu, x_dtype, b_dtype, descending):
    raw = rng.normal(0, 50, 4000)
    x = (np.abs(raw) if np.dtype(x_dtype).kind in "ub" else raw).astype(x_dtype)
    if np.dtype(x_dtype).kind == "f":
        x[::7] = np.nan
    bounds = np.unique(np.abs(rng.normal(0, 50, 9)).astype(b_dtype))
    bounds = bounds[::-1].copy() if descending else bounds
    same_bits(ops.bucketize(dev(x), dev(bounds)), ops.bucketize(x, bounds))


def test_bucketize_compares_in_numpy_result_type(gpu):
    cases = [
        (np.array([2**53 + 3, 2**53 + 1], np.int64), np.array([2.0**53 + 4])),
        (np.array([2**63 + 3, 5], np.uint64), np.array([2**62], np.int64)),
        (np.array([16777217, -3], np.int32), np.array([16777218.0], np.float32)),
    ]
    for x, bounds in cases:
        same_bits(ops.bucketize(dev(x), dev(bounds)), np.digitize(x, bounds).astype(np.int64))


def test_bucketize_rejects_bad_boundaries(gpu):
    x = dev(np.float32([1.0, 2.0]))
    for bounds in (np.float64([1.0, np.nan]), np.float32([np.nan]), np.float64([0.0, np.nan, 1.0])):
        with pytest.raises(ValueError, match="NaN"):
            ops.bucketize(x, dev(bounds))
    for bounds in (np.float64([1.0, 3.0, 2.0]), np.float32([3.0, 1.0, 2.0]), np.int64([0, 2, 1])):
        with pytest.raises(ValueError, match="monotonically"):
            ops.bucketize(x, dev(bounds))
    assert gpu == []


def test_subnormals(gpu):
    tiny = np.array([-1e-40, -1e-45, 0.0, 1e-45, 1e-41, 1e-40, 1e-38], dtype=np.float32)
    x = np.concatenate([tiny, -tiny, np.float32([np.nan])])
    for bounds in (tiny, tiny.astype(np.float64), tiny[::-1].copy()):
        same_bits(ops.bucketize(dev(x), dev(bounds)), ops.bucketize(x, bounds))
    for log in (True, False):
        doubles = x.astype(np.float64) * 0.75
        same_bits(ops.normalize_dense(dev(x), clip_min=None, log=log), ops.normalize_dense(x, clip_min=None, log=log))
        same_bits(ops.normalize_dense(dev(doubles), clip_min=None, log=log),
                  ops.normalize_dense(doubles, clip_min=None, log=log))


@pytest.mark.parametrize("fill,clip,log", [(0.0, 0.0, True), (-3.0, None, True), (float("nan"), -2.0, True),
                                           (1.5, 0.25, False)])
def test_normalize_dense(gpu, fill, clip, log):
    x = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    same_bits(ops.normalize_dense(dev(x), fill, clip, log), ops.normalize_dense(x, fill, clip, log))
    doubles = rng.lognormal(0, 3, 1000).reshape(10, 100)
    same_bits(ops.normalize_dense(dev(doubles), fill, clip, log), ops.normalize_dense(doubles, fill, clip, log))


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("max_len", [None, 1, 3])
def test_multi_hot_and_keyed_jagged(gpu, dtype, max_len):
    lengths = rng.integers(0, 6, 500)
    offsets = np.concatenate([[2], 2 + np.cumsum(lengths)]).astype(np.int32)
    values = rng.integers(-(2**31), 2**31 - 1, int(offsets[-1]) + 3).astype(dtype)
    on_gpu = ops.multi_hot(dev(offsets), dev(values), 1009, 4, max_len)
    on_cpu = ops.multi_hot(offsets, values, 1009, 4, max_len)
    both = (ops.keyed_jagged([on_gpu, on_gpu]), ops.keyed_jagged([on_cpu, on_cpu]))
    for g, c in ((on_gpu, on_cpu), both):
        for field in ("values", "lengths", "offsets"):
            same_bits(getattr(g, field), getattr(c, field))
    assert gpu == [f"fl_multi_hot_bucket_u{values.itemsize * 8}"]


def test_multi_hot_with_strided_offsets(gpu):
    offsets = np.arange(0, 41, dtype=np.int64)
    values = np.arange(40, dtype=np.int64)
    same_bits(ops.multi_hot(dev(offsets)[::4], dev(values), 97, 0, 2).values,
              ops.multi_hot(offsets[::4], values, 97, 0, 2).values)


def test_multi_hot_strings(gpu):
    words = ops.Strings.from_pylist([f"w{i % 31}" for i in range(300)])
    offsets = np.arange(0, 301, 7).astype(np.int64)
    device_words = ops.Strings(dev(words.offsets), dev(words.data))
    same_bits(ops.multi_hot(dev(offsets), device_words, 100, 1, 3).values,
              ops.multi_hot(offsets, words, 100, 1, 3).values)


def test_hash_columns(gpu):
    raw = rng.integers(-(2**63), 2**63 - 1, (5, 700), dtype=np.int64)
    for plan in (ops.hash_plan([4, 0, 2], [1_000_003, 1, 2**32 - 1], [0, 7, 2**32 - 1], [3, 0, 1]),
                 ops.hash_plan([[0, 1], [3, 3]], [977, 2**31], [1, 2])):
        out = np.full((4, raw.shape[1]), -1, np.int64)
        same_bits(ops.hash_columns(dev(raw), plan, dev(out)), ops.hash_columns(raw, plan, out))
    assert gpu == ["fl_hash_columns", "fl_hash_columns"]


def test_normalize_columns(gpu):
    raw = rng.integers(0, 2**32, (3, 4000), dtype=np.uint64).astype(np.uint32).view(np.float32)
    raw[0, :7] = [np.nan, -1.0, -0.0, 1e-45, np.inf, -2.0, 65536.0]
    plan = ops.dense_plan([2, 0, 1, 0], [0.0, -3.0, float("nan"), 1.5], [0.0, None, -2.0, 0.25],
                          [True, True, True, False])
    same_bits(ops.normalize_columns(dev(raw), plan), ops.normalize_columns(raw, plan))
    assert gpu == ["fl_normalize_columns"]


def test_mixed_kinds_are_rejected(gpu):
    with pytest.raises(TypeError, match=r"NumPy or all CuPy; got CuPy for \[.a.\]"):
        ops.cross(dev(np.arange(3)), np.arange(3), 10)


def test_every_kernel_is_launched_by_some_input(gpu):
    """Across the dtypes each op takes, the launches reach every kernel NVRTC sees in every .cu file."""
    for dtype in (np.int32, np.uint32, np.int64, np.uint64):
        keys = np.arange(-20, 20).astype(dtype)
        same_bits(ops.murmur3_32(dev(keys), 1), ops.murmur3_32(keys, 1))
        same_bits(ops.hash_buckets(dev(keys), 13, 1), ops.hash_buckets(keys, 13, 1))
    words = ops.Strings.from_pylist(["", "a", "abcde"])
    device_words = ops.Strings(dev(words.offsets), dev(words.data))
    same_bits(ops.murmur3_32(device_words, 2), ops.murmur3_32(words, 2))
    same_bits(ops.hash_buckets(device_words, 13, 2), ops.hash_buckets(words, 13, 2))
    a, b = np.arange(-5, 5, dtype=np.int64), np.arange(10, dtype=np.int64)
    same_bits(ops.cross(dev(a), dev(b), 11, 3), ops.cross(a, b, 11, 3))
    for x_dtype, b_dtype in ((np.float32, np.float32), (np.float32, np.float64), (np.float64, np.float32),
                             (np.float64, np.float64), (np.int64, np.int64), (np.uint64, np.uint64)):
        x = np.array([0, 1, 2, 3, 7], dtype=x_dtype)
        bounds = np.array([1, 3], dtype=b_dtype)
        same_bits(ops.bucketize(dev(x), dev(bounds)), ops.bucketize(x, bounds))
    for dtype in (np.float32, np.float64):
        x = np.array([np.nan, -1.0, 0.5, 100.0], dtype=dtype)
        same_bits(ops.normalize_dense(dev(x)), ops.normalize_dense(x))
    raw = np.arange(-6, 6, dtype=np.int64).reshape(2, 6)
    for plan in (ops.hash_plan([1], [7], [3]), ops.hash_plan([[0, 1]], [7], [3])):
        same_bits(ops.hash_columns(dev(raw), plan), ops.hash_columns(raw, plan))
    floats, plan = raw.astype(np.float32), ops.dense_plan([1], [0.0], [0.0], [True])
    same_bits(ops.normalize_columns(dev(floats), plan), ops.normalize_columns(floats, plan))
    offsets = np.array([0, 2, 5], dtype=np.int64)
    for dtype in (np.int32, np.int64):
        values = np.arange(5, dtype=dtype)
        same_bits(ops.multi_hot(dev(offsets), dev(values), 7).values, ops.multi_hot(offsets, values, 7).values)

    defined = {(filename, kernel) for filename in ck.CU_FILES for kernel in ck.file_kernels(filename)}
    assert gpu.kernels == defined, {"never launched": sorted(defined - gpu.kernels),
                                    "not defined": sorted(gpu.kernels - defined)}
