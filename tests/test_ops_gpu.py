"""Each CuPy kernel equals its NumPy twin bit for bit (runs where there is a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_guard import cupy_where_gpu

# Skipped where there is no GPU (conftest); where there is one, a CuPy that does not import or reach it fails.
cupy = cupy_where_gpu()
pytestmark = pytest.mark.gpu

from feedline import ops  # noqa: E402

N = 1_000_000
rng = np.random.default_rng(1234)


def same_bits(gpu_result, cpu_result) -> None:
    host = cupy.asnumpy(gpu_result)
    assert host.dtype == cpu_result.dtype and host.shape == cpu_result.shape
    np.testing.assert_array_equal(host.view(np.uint8), cpu_result.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.int64, np.uint64, np.int32, np.uint32])
@pytest.mark.parametrize("seed", [0, 42, 2**32 - 1])
def test_hash_fixed(dtype, seed):
    info = np.iinfo(dtype)
    keys = rng.integers(info.min, info.max, N, dtype=dtype, endpoint=True)
    same_bits(ops.murmur3_32(cupy.asarray(keys), seed), ops.murmur3_32(keys, seed))
    for num_buckets in (1 << 20, 1_000_003):
        same_bits(ops.hash_buckets(cupy.asarray(keys), num_buckets, seed), ops.hash_buckets(keys, num_buckets, seed))


def test_hash_strings():
    lengths = rng.integers(0, 40, 200_000)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
    cpu = ops.Strings(offsets[5:], data)
    gpu = ops.Strings(cupy.asarray(offsets[5:]), cupy.asarray(data))
    same_bits(ops.murmur3_32(gpu, 7), ops.murmur3_32(cpu, 7))
    same_bits(ops.hash_buckets(gpu, 1_000_003, 7), ops.hash_buckets(cpu, 1_000_003, 7))


def test_cross():
    a = rng.integers(-(2**63), 2**63 - 1, N, dtype=np.int64)
    b = rng.integers(-(2**31), 2**31 - 1, N, dtype=np.int32)
    same_bits(ops.cross(cupy.asarray(a), cupy.asarray(b), 999_983, 5), ops.cross(a, b, 999_983, 5))


@pytest.mark.parametrize(
    "x_dtype,b_dtype", [(np.float32, np.float32), (np.float32, np.float64), (np.int64, np.float64),
                        (np.int64, np.int64), (np.uint64, np.uint64), (np.int32, np.uint32), (np.float16, np.float32)],
)
@pytest.mark.parametrize("descending", [False, True])
def test_bucketize(x_dtype, b_dtype, descending):
    raw = rng.normal(0, 1000, N)
    x = (np.abs(raw) if np.dtype(x_dtype).kind == "u" else raw).astype(x_dtype)
    if np.dtype(x_dtype).kind == "f":
        x[::13] = np.nan
    bounds = np.unique(np.abs(rng.normal(0, 1000, 30)).astype(b_dtype))
    bounds = bounds[::-1].copy() if descending else bounds
    same_bits(ops.bucketize(cupy.asarray(x), cupy.asarray(bounds)), ops.bucketize(x, bounds))


def test_subnormals_are_not_flushed():
    tiny = np.array([-1e-40, -1e-45, 0.0, 1e-45, 1e-41, 1e-40, 1e-38], dtype=np.float32)
    x = np.concatenate([tiny, -tiny, np.float32([np.nan])])
    for bounds in (tiny, tiny.astype(np.float64), tiny[::-1].copy()):
        same_bits(ops.bucketize(cupy.asarray(x), cupy.asarray(bounds)), ops.bucketize(x, bounds))
    for log in (True, False):
        same_bits(ops.normalize_dense(cupy.asarray(x), clip_min=None, log=log),
                  ops.normalize_dense(x, clip_min=None, log=log))
        doubles = x.astype(np.float64) * 0.75
        same_bits(ops.normalize_dense(cupy.asarray(doubles), clip_min=None, log=log),
                  ops.normalize_dense(doubles, clip_min=None, log=log))


@pytest.mark.parametrize("fill,clip,log", [(0.0, 0.0, True), (-3.0, None, True), (float("nan"), -2.0, True),
                                           (1.5, 0.25, False)])
def test_normalize_dense(fill, clip, log):
    x = rng.integers(0, 2**32, 4 * N, dtype=np.uint64).astype(np.uint32).view(np.float32)
    same_bits(ops.normalize_dense(cupy.asarray(x), fill, clip, log), ops.normalize_dense(x, fill, clip, log))
    dense = rng.lognormal(0, 4, N).astype(np.float32) - 1
    same_bits(ops.normalize_dense(cupy.asarray(dense), fill, clip, log), ops.normalize_dense(dense, fill, clip, log))


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("max_len", [None, 1, 5])
def test_multi_hot(dtype, max_len):
    lengths = rng.integers(0, 12, 100_000)
    offsets = np.concatenate([[3], 3 + np.cumsum(lengths)]).astype(np.int64)
    values = rng.integers(-(2**31), 2**31 - 1, int(offsets[-1]) + 4).astype(dtype)
    gpu = ops.multi_hot(cupy.asarray(offsets), cupy.asarray(values), 100_003, 9, max_len)
    cpu = ops.multi_hot(offsets, values, 100_003, 9, max_len)
    for field in ("values", "lengths", "offsets"):
        same_bits(getattr(gpu, field), getattr(cpu, field))
    kjt_gpu, kjt_cpu = ops.keyed_jagged([gpu, gpu]), ops.keyed_jagged([cpu, cpu])
    for field in ("values", "lengths", "offsets"):
        same_bits(getattr(kjt_gpu, field), getattr(kjt_cpu, field))


def test_multi_hot_strings():
    words = ops.Strings.from_pylist([f"w{i % 977}" for i in range(10_000)])
    offsets = np.arange(0, 10_001, 7).astype(np.int64)
    gpu_words = ops.Strings(cupy.asarray(words.offsets), cupy.asarray(words.data))
    gpu = ops.multi_hot(cupy.asarray(offsets), gpu_words, 1000, 1, 3)
    cpu = ops.multi_hot(offsets, words, 1000, 1, 3)
    same_bits(gpu.values, cpu.values)


def test_hash_columns_and_crosses():
    raw = rng.integers(-(2**63), 2**63 - 1, (8, N // 8), dtype=np.int64)
    for plan in (ops.hash_plan([3, 0, 7, 1], [1_000_003, 1 << 20, 2**32 - 1, 1], [0, 5, 2**32 - 1, 9], [2, 0, 3, 5]),
                 ops.hash_plan([[0, 1], [6, 2]], [999_983, 7], [1, 2], [1, 0])):
        out = np.zeros((6, raw.shape[1]), np.int64)
        same_bits(ops.hash_columns(cupy.asarray(raw), plan, cupy.asarray(out)), ops.hash_columns(raw, plan, out))


def test_normalize_columns():
    raw = rng.integers(0, 2**32, (4, N // 4), dtype=np.uint64).astype(np.uint32).view(np.float32)
    raw[1] = np.floor(rng.lognormal(2, 3, N // 4))
    plan = ops.dense_plan([1, 0, 3, 2, 1], [0.0, -3.0, float("nan"), 1.5, 2.0], [0.0, None, -2.0, 0.25, None],
                          [True, True, True, False, True])
    same_bits(ops.normalize_columns(cupy.asarray(raw), plan), ops.normalize_columns(raw, plan))


def test_mixing_numpy_and_cupy_is_a_type_error():
    with pytest.raises(TypeError, match="NumPy or all CuPy"):
        ops.cross(cupy.arange(3), np.arange(3), 10)
