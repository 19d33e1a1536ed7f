"""CUDA sources in feedline/ops compile, and their arithmetic equals the NumPy twins bit for bit.

No GPU is needed: nvcc compiles each file for the device; NVRTC (as CuPy uses it at run time)
compiles the inlined sources; and a host build of the same ``__host__ __device__`` functions runs
here through ctypes against the NumPy implementations.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from feedline.ops import _cuda, log1p64

CU_FILES = sorted(p.name for p in _cuda.KERNEL_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

HARNESS = r"""
#include "hash_fixed.cu"
#include "hash_strings.cu"
#include "cross.cu"
#include "bucketize.cu"
#include "normalize_dense.cu"
#include "multi_hot.cu"

extern "C" {
void h_murmur3_u32(const unsigned int* v, long long n, unsigned int seed, unsigned int* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_murmur3_u32(v[i], seed);
}
void h_murmur3_u64(const unsigned long long* v, long long n, unsigned int seed, unsigned int* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_murmur3_u64(v[i], seed);
}
void h_murmur3_strings(const long long* offsets, const unsigned char* data, long long n,
                       unsigned int seed, unsigned int* out) {
    for (long long i = 0; i < n; ++i)
        out[i] = fl_murmur3_bytes(data + offsets[i], offsets[i + 1] - offsets[i], seed);
}
void h_cross(const unsigned long long* a, const unsigned long long* b, long long n,
             unsigned int seed, unsigned int num_buckets, long long* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_murmur3_pair_u64(a[i], b[i], seed) % num_buckets;
}
void h_digitize_f32_f64(const float* x, long long n, const double* bins, long long nbins, int desc,
                        long long* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_digitize<float, double>(x[i], bins, nbins, desc);
}
void h_normalize(const float* x, long long n, double fill, double clip, int do_clip, int do_log,
                 float* out) {
    for (long long i = 0; i < n; ++i)
        out[i] = fl_float_from_bits(fl_normalize_bits(fl_f32_to_f64(x[i]), fill, clip, do_clip, do_log));
}
void h_f32_to_f64(const float* x, long long n, double* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_f32_to_f64(x[i]);
}
void h_f64_to_f32(const double* x, long long n, unsigned int* out) {
    for (long long i = 0; i < n; ++i) out[i] = fl_f64_to_f32_bits(x[i]);
}
void h_row_of_output(const long long* out_offsets, long long rows, long long total, long long* out) {
    for (long long i = 0; i < total; ++i) out[i] = fl_row_of_output(out_offsets, rows, i);
}
}
"""


def _ptr(array: np.ndarray):
    return ctypes.c_void_p(array.ctypes.data)


@needs_nvcc
@pytest.mark.parametrize("filename", CU_FILES)
def test_each_kernel_file_compiles_with_nvcc(filename, tmp_path):
    result = subprocess.run(
        [NVCC, "-ptx", "--std=c++17", "--fmad=false", "-I", str(_cuda.KERNEL_DIR),
         "-o", str(tmp_path / "k.ptx"), str(_cuda.KERNEL_DIR / filename)],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr


def test_every_launched_kernel_is_defined():
    sources = "".join((_cuda.KERNEL_DIR / f).read_text() for f in CU_FILES)
    defined = set(re.findall(r'extern "C" __global__ void (\w+)', sources))
    defined |= {f"fl_bucketize_{s}" for s in re.findall(r"FL_DEFINE_BUCKETIZE\((\w+),", sources)}
    python = "".join(p.read_text() for p in _cuda.KERNEL_DIR.glob("*.py"))
    launched = set(re.findall(r'"(fl_\w+)"', python))
    launched |= {f"fl_murmur3_{kind}_u{bits}" for kind in ("hash", "bucket") for bits in (32, 64)}
    launched |= {f"fl_multi_hot_bucket_u{bits}" for bits in (32, 64)}
    launched |= {f"fl_bucketize_{x}_{b}" for x in ("f32", "f64") for b in ("f32", "f64")}
    launched |= {"fl_bucketize_i64_i64", "fl_bucketize_u64_u64"}
    launched |= {"fl_normalize_dense_f32", "fl_normalize_dense_f64"}
    assert launched <= defined, launched - defined


def test_nvrtc_compiles_the_runtime_sources():
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception as exc:  # cupy absent, or its NVRTC library missing
        pytest.skip(f"NVRTC unavailable: {exc}")
    for filename in CU_FILES:
        program = nvrtc.createProgram(_cuda.kernel_source(filename), filename, [], [])
        try:
            nvrtc.compileProgram(program, [*_cuda.NVRTC_OPTIONS, "-arch=compute_80"])
        except nvrtc.NVRTCError:
            pytest.fail(f"{filename}:\n{nvrtc.getProgramLog(program)}")
        finally:
            nvrtc.destroyProgram(program)


def test_kernels_do_not_depend_on_flush_to_zero():
    """CuPy appends -ftz=true to every compile; only float32 casts of normal results may carry .ftz."""
    try:
        from cupy_backends.cuda.libs import nvrtc
    except Exception as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    allowed = re.compile(r"^\s*cvt\.rn\.ftz\.f32\.f64\b")
    for filename in CU_FILES:
        program = nvrtc.createProgram(_cuda.kernel_source(filename), filename, [], [])
        try:
            nvrtc.compileProgram(program, [*_cuda.NVRTC_OPTIONS, "-arch=compute_80", "-ftz=true"])
            ptx = nvrtc.getPTX(program)
        finally:
            nvrtc.destroyProgram(program)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        flushing = [line.strip() for line in ptx.splitlines() if ".ftz" in line and not allowed.match(line)]
        assert not flushing, (filename, flushing[:5])
        assert "fma." not in ptx, filename


def test_log1p_constants_in_cuda_match_python():
    text = (_cuda.KERNEL_DIR / "log1p64.cuh").read_text()
    literals = [float.fromhex(h) for h in re.findall(r"0x1\.[0-9a-f]+p[-+]\d+", text)]
    expected = [log1p64.TINY, -log1p64.TINY, log1p64.SQRT_HALF,
                *reversed(log1p64.HORNER_COEFFS), log1p64.LN2]
    assert [abs(v) for v in literals] == [abs(v) for v in expected]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not found")
    work = tmp_path_factory.mktemp("harness")
    (work / "harness.cu").write_text(HARNESS)
    lib = work / "harness.so"
    result = subprocess.run(
        [NVCC, "-shared", "-Xcompiler", "-fPIC,-ffp-contract=off", "--std=c++17",
         "-I", str(_cuda.KERNEL_DIR), "-o", str(lib), str(work / "harness.cu")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    return ctypes.CDLL(str(lib))


def test_host_murmur3_fixed_equals_numpy(harness):
    from feedline.ops import murmur3_32

    rng = np.random.default_rng(1)
    v64 = rng.integers(-(2**63), 2**63 - 1, 100_000, dtype=np.int64)
    v32 = rng.integers(-(2**31), 2**31 - 1, 100_000, dtype=np.int32)
    for values, fn in ((v64, harness.h_murmur3_u64), (v32, harness.h_murmur3_u32)):
        for seed in (0, 42, 2**32 - 1):
            out = np.empty(values.shape[0], dtype=np.uint32)
            fn(_ptr(values), ctypes.c_longlong(values.shape[0]), ctypes.c_uint(seed), _ptr(out))
            np.testing.assert_array_equal(out, murmur3_32(values, seed))


def test_host_murmur3_strings_equals_numpy(harness):
    from feedline.ops import Strings, murmur3_32

    rng = np.random.default_rng(2)
    words = ["".join(chr(c) for c in rng.integers(32, 0x3000, rng.integers(0, 40))) for _ in range(3000)]
    strings = Strings.from_pylist(words)
    out = np.empty(len(words), dtype=np.uint32)
    harness.h_murmur3_strings(_ptr(strings.offsets), _ptr(strings.data), ctypes.c_longlong(len(words)),
                              ctypes.c_uint(7), _ptr(out))
    np.testing.assert_array_equal(out, murmur3_32(strings, 7))


def test_host_cross_equals_numpy(harness):
    from feedline.ops import cross

    rng = np.random.default_rng(3)
    a = rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64)
    b = rng.integers(-(2**63), 2**63 - 1, 50_000, dtype=np.int64)
    out = np.empty(a.shape[0], dtype=np.int64)
    harness.h_cross(_ptr(a), _ptr(b), ctypes.c_longlong(a.shape[0]), ctypes.c_uint(9),
                    ctypes.c_uint(1_000_003), _ptr(out))
    np.testing.assert_array_equal(out, cross(a, b, 1_000_003, seed=9))


@pytest.mark.parametrize("descending", [False, True])
def test_host_digitize_equals_numpy(harness, descending):
    rng = np.random.default_rng(4)
    bins = np.sort(rng.integers(-20, 20, 15)).astype(np.float64)
    if descending:
        bins = bins[::-1].copy()
    x = rng.integers(-25, 25, 20_000).astype(np.float32)
    x[::7] = np.nan
    x[1::11] += 0.5
    out = np.empty(x.shape[0], dtype=np.int64)
    harness.h_digitize_f32_f64(_ptr(x), ctypes.c_longlong(x.shape[0]), _ptr(bins),
                           ctypes.c_longlong(bins.shape[0]), ctypes.c_int(descending), _ptr(out))
    np.testing.assert_array_equal(out, np.digitize(x, bins))


@pytest.mark.parametrize("fill,clip,do_log", [(0.0, 0.0, True), (-3.0, None, True),
                                              (float("nan"), -2.0, True), (1.5, 0.25, False)])
def test_host_normalize_equals_numpy_bitwise(harness, fill, clip, do_log):
    from feedline.ops import normalize_dense

    rng = np.random.default_rng(5)
    x = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([x, np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45,
                                     2.0**-29, -(2.0**-29), 2.0**53, 3.4e38], dtype=np.float32)])
    out = np.empty_like(x)
    harness.h_normalize(_ptr(x), ctypes.c_longlong(x.shape[0]), ctypes.c_double(fill),
                        ctypes.c_double(0.0 if clip is None else clip), ctypes.c_int(clip is not None),
                        ctypes.c_int(do_log), _ptr(out))
    expected = normalize_dense(x, fill_value=fill, clip_min=clip, log=do_log)
    np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_host_float_conversions_are_exact_casts(harness):
    rng = np.random.default_rng(6)
    f32 = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    f32[:4] = [0x00000001, 0x807FFFFF, 0x7F800000, 0x7FC00001]  # subnormals, inf, NaN payload
    widened = np.empty(f32.shape[0], dtype=np.float64)
    harness.h_f32_to_f64(_ptr(f32), ctypes.c_longlong(f32.shape[0]), _ptr(widened))
    with np.errstate(invalid="ignore"):
        expected = f32.view(np.float32).astype(np.float64)
    np.testing.assert_array_equal(widened.view(np.uint64), expected.view(np.uint64))

    f64 = rng.integers(0, 2**64, 1_000_000, dtype=np.uint64).view(np.float64)
    near_subnormal = rng.uniform(-(2.0**-120), 2.0**-120, 200_000)
    halfway = (np.arange(1, 2001, dtype=np.float64) + 0.5) * 2.0**-149  # ties to even
    f64 = np.concatenate([f64, near_subnormal, halfway, -halfway, [2.0**-126 * (1 - 2.0**-30)]])
    narrowed = np.empty(f64.shape[0], dtype=np.uint32)
    harness.h_f64_to_f32(_ptr(f64), ctypes.c_longlong(f64.shape[0]), _ptr(narrowed))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = f64.astype(np.float32)
    expected[np.isnan(expected)] = np.nan
    np.testing.assert_array_equal(narrowed, expected.view(np.uint32))


def test_host_row_search_equals_numpy(harness):
    lengths = np.array([0, 3, 0, 0, 2, 1, 0], dtype=np.int64)
    out_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(out_offsets[-1])
    out = np.empty(total, dtype=np.int64)
    harness.h_row_of_output(_ptr(out_offsets), ctypes.c_longlong(lengths.shape[0]),
                            ctypes.c_longlong(total), _ptr(out))
    np.testing.assert_array_equal(out, np.repeat(np.arange(lengths.shape[0]), lengths))
