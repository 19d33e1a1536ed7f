"""CUDA sources in feedline/ops compile, and their arithmetic equals the NumPy twins bit for bit.

No GPU is needed: nvcc compiles each file for the device; NVRTC (as CuPy uses it at run time)
compiles the inlined sources; and a host build of the same ``__host__ __device__`` functions runs
here through ctypes against the NumPy implementations.

Kernel names are read from both sides (the preprocessed ``kernel_source()`` of each .cu file, and the
``launch(file, name, ...)`` calls in ops/*.py) and must agree; constants in the kernel sources are
compared with the NumPy side's as exact integers and float64 bit patterns.
"""

from __future__ import annotations

import ast
import ctypes
import decimal
import math
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from feedline.ops import _cuda, _murmur3_words, log1p64

import cuda_kernels as ck

CU_FILES = list(ck.CU_FILES)
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")
needs_cxx = pytest.mark.skipif(ck.CXX is None, reason="no C++ compiler to preprocess the CUDA sources")

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

# C scalar parameter types and the NumPy scalar type a launch must wrap its argument in (CuPy
# passes a NumPy scalar's bytes as they are; a Python int would go as 8 bytes whatever the C type).
C_SCALAR_TO_NUMPY = {
    "int": "int32",
    "unsigned int": "uint32",
    "long long": "int64",
    "unsigned long long": "uint64",
    "float": "float32",
    "double": "float64",
}


def _ptr(array: np.ndarray):
    return ctypes.c_void_p(array.ctypes.data)


def _bits(values) -> list[int]:
    """float64 bit patterns (distinguishes -0.0 from 0.0 and every NaN payload)."""
    return [struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values]


def _header_functions(name: str) -> dict[str, str]:
    return ck.c_functions((_cuda.KERNEL_DIR / name).read_text(encoding="utf-8"))


def _nvcc_ptx(source: Path, out: Path, *include: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NVCC, "-ptx", "--std=c++17", "--fmad=false", *include, "-o", str(out), str(source)],
        capture_output=True, text=True, check=False,
    )


def test_kernel_files_are_found():
    assert CU_FILES, f"no .cu files in {_cuda.KERNEL_DIR}"  # else every parametrized check is empty


@needs_nvcc
@pytest.mark.parametrize("filename", CU_FILES)
def test_each_kernel_file_compiles_with_nvcc(filename, tmp_path):
    """The file as it is (headers from -I), and the inlined text NVRTC gets, with no header in reach."""
    result = _nvcc_ptx(_cuda.KERNEL_DIR / filename, tmp_path / "k.ptx", "-I", str(_cuda.KERNEL_DIR))
    assert result.returncode == 0, result.stderr
    inlined = tmp_path / "inlined" / filename
    inlined.parent.mkdir()
    inlined.write_text(_cuda.kernel_source(filename), encoding="utf-8")
    result = _nvcc_ptx(inlined, tmp_path / "inlined.ptx")
    assert result.returncode == 0, result.stderr


@needs_cxx
@pytest.mark.parametrize("filename", CU_FILES)
def test_kernel_source_inlines_every_local_header(filename):
    text = _cuda.kernel_source(filename)
    assert not re.search(r'^\s*#\s*include\s*"', text, re.MULTILINE), "a local #include was left in"
    assert not re.search(r"^\s*#\s*pragma\s+once", text, re.MULTILINE)
    assert ck.file_kernels(filename), f"{filename} defines no extern \"C\" __global__ kernel"


@needs_cxx
def test_launched_kernels_and_defined_kernels_agree():
    """Every launch(file, name, ...) in ops/*.py names a kernel of that file; every kernel is launched."""
    sites = ck.launch_sites()
    assert sites, "no launch() calls found in ops/*.py"
    for site in sites:
        assert site.file in CU_FILES, f"{site.where} launches from {site.file}, which is not in ops/"
        defined = ck.file_kernels(site.file)
        for pattern in site.patterns:
            assert any(re.fullmatch(pattern, k) for k in defined), (
                f"{site.where}: no kernel in {site.file} matches {pattern!r}; defined: {sorted(defined)}")
    for filename in CU_FILES:
        for kernel in ck.file_kernels(filename):
            launchers = [s.where for s in sites if s.file == filename and s.matches(kernel)]
            assert launchers, f"{filename}: kernel {kernel} is never launched from ops/*.py"


def _param(decl: str) -> tuple[str, bool]:
    """(C type without const, is_pointer) of one parameter declaration."""
    words = decl.replace("*", " * ").replace("const", " ").split()
    return " ".join(w for w in words[:-1] if w != "*"), "*" in words


def _numpy_scalar(node: ast.expr) -> str | None:
    """'int64' for ``np.int64(...)``, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id in ("np", "numpy")):
        return node.func.attr
    return None


@needs_cxx
def test_launch_arguments_fit_the_kernel_signatures():
    """Argument count, and each scalar wrapped in the NumPy type of its C parameter."""
    for site in ck.launch_sites():
        assert isinstance(site.args, ast.Tuple), f"{site.where}: kernel arguments must be a tuple literal"
        for kernel, params in ck.file_kernels(site.file).items():
            if not site.matches(kernel):
                continue
            assert len(site.args.elts) == len(params), (
                f"{site.where}: {len(site.args.elts)} arguments for {kernel}{params}")
            for decl, arg in zip(params, site.args.elts):
                ctype, pointer = _param(decl)
                wrapped = _numpy_scalar(arg)
                if pointer:
                    assert wrapped is None and not isinstance(arg, ast.Constant), (
                        f"{site.where}: {kernel} parameter {decl!r} given {ast.unparse(arg)}")
                else:
                    assert wrapped == C_SCALAR_TO_NUMPY[ctype], (
                        f"{site.where}: {kernel} parameter {decl!r} given {ast.unparse(arg)}; "
                        f"needs np.{C_SCALAR_TO_NUMPY[ctype]}(...)")


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


# --- constants -----------------------------------------------------------------------------------

# MurmurHash3_x86_32 as Austin Appleby published it (smhasher MurmurHash3.cpp).
MURMUR3_SPEC = {"c1": 0xCC9E2D51, "r1": 15, "c2": 0x1B873593, "r2": 13, "m": 5, "n": 0xE6546B64,
                "s1": 16, "f1": 0x85EBCA6B, "s2": 13, "f2": 0xC2B2AE35, "s3": 16}


def _cuda_murmur3_constants() -> dict[str, int]:
    functions = _header_functions("murmur3.cuh")
    found = {}
    for function, names in (("fl_murmur3_mix_k", ("c1", "r1", "c2")),
                            ("fl_murmur3_step", ("r2", "m", "n")),
                            ("fl_murmur3_finish", ("s1", "f1", "s2", "f2", "s3"))):
        literals = ck.int_literals(functions[function])
        assert len(literals) == len(names), f"{function}: integer literals {literals}, expected {names}"
        found.update(zip(names, literals))
    rotl = ck.int_literals(functions["fl_rotl32"])
    assert rotl == [32], f"fl_rotl32 literals {rotl}"
    return found


def test_murmur3_constants_in_cuda_equal_numpy_and_the_reference():
    cuda = _cuda_murmur3_constants()
    assert cuda == MURMUR3_SPEC
    w = _murmur3_words
    numpy_side = {"c1": w.C1, "c2": w.C2, "m": w.H_MUL, "n": w.H_ADD, "f1": w.F1, "f2": w.F2}
    for name, value in numpy_side.items():
        assert type(value) is np.uint32, f"{name} is {type(value).__name__}, not a wrapped np.uint32"
        assert int(value) == cuda[name], f"{name}: NumPy {int(value):#x}, CUDA {cuda[name]:#x}"


def test_numpy_murmur3_steps_use_the_cuda_rotations_and_shifts():
    """The NumPy mixers equal the steps written out with the constants read from murmur3.cuh."""
    k = _cuda_murmur3_constants()
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    def mix_k(x: int) -> int:
        return rotl(x * k["c1"] & mask, k["r1"]) * k["c2"] & mask

    def mix_h(h: int) -> int:
        return (rotl(h, k["r2"]) * k["m"] + k["n"]) & mask

    def fmix(h: int) -> int:
        h ^= h >> k["s1"]
        h = h * k["f1"] & mask
        h ^= h >> k["s2"]
        h = h * k["f2"] & mask
        return h ^ (h >> k["s3"])

    rng = np.random.default_rng(10)
    words = np.concatenate([np.array([0, 1, 0x80000000, mask], dtype=np.uint32),
                            rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)])
    tmp = np.empty_like(words)
    for numpy_step, python_step in ((_murmur3_words.mix_k_inplace, mix_k),
                                    (_murmur3_words.mix_h_inplace, mix_h),
                                    (_murmur3_words.fmix_inplace, fmix)):
        got = words.copy()
        numpy_step(got, tmp)
        assert got.tolist() == [python_step(int(v)) for v in words.tolist()], numpy_step.__name__

    from feedline.ops import murmur3_32

    def hash_u64(value: int, seed: int) -> int:
        h = seed
        for block in (value & mask, (value >> 32) & mask):
            h = mix_h(h ^ mix_k(block))
        return fmix(h ^ 8)

    keys = np.concatenate([np.array([10, 0, -1, -(2**63), 2**63 - 1], dtype=np.int64),
                           rng.integers(-(2**63), 2**63 - 1, 500, dtype=np.int64)])
    for seed in (0, 42, 2**32 - 1):
        expected = [hash_u64(v & (2**64 - 1), seed) for v in keys.tolist()]
        assert murmur3_32(keys, seed).tolist() == expected, seed
    assert hash_u64(10, 0) == 4004982076 and hash_u64(10, 42) == 4279022973  # cuDF, README


def test_log1p_constants_in_cuda_match_python_bit_for_bit():
    body = _header_functions("log1p64.cuh")["fl_log1p_f32_bits"]
    literals = ck.hex_float_literals(body)
    expected = [log1p64.TINY, -log1p64.TINY, log1p64.SQRT_HALF, *reversed(log1p64.HORNER_COEFFS), log1p64.LN2]
    assert _bits(literals) == _bits(expected), [v.hex() for v in literals]

    # The Python constants are the float64 values they stand for (correctly rounded).
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        assert _bits([log1p64.LN2]) == _bits([float(decimal.Decimal(2).ln())])
        assert _bits([log1p64.SQRT_HALF]) == _bits([float(decimal.Decimal("0.5").sqrt())])
    assert _bits(log1p64.HORNER_COEFFS) == _bits([1 / (2 * n + 1) for n in range(10)])
    assert log1p64.TINY == math.ldexp(1.0, -29)

    # Special results: float32 bits the kernel returns directly, and what NumPy produces.
    special = ck.int_literals(body)[:3]
    with np.errstate(all="ignore"):
        numpy_special = log1p64.log1p_float32(np.array([np.nan, -1.0, np.inf], dtype=np.float32))
    assert special == numpy_special.view(np.uint32).tolist(), [hex(v) for v in special]
    assert _bits([max(ck.dec_float_literals(body))]) == _bits([np.finfo(np.float64).max])


def test_float_bits_constants_match_numpy_formats():
    """The IEEE field layout in float_bits.cuh, from np.finfo of float32/float64."""
    f32, f64 = np.finfo(np.float32), np.finfo(np.float64)
    functions = _header_functions("float_bits.cuh")
    widen = functions["fl_f32_to_f64"]
    assert set(ck.int_literals(widen)) - {0} == {
        f32.bits - 1,                             # float32 sign bit
        f64.bits - 1,                             # float64 sign bit
        f32.nmant,                                # float32 exponent position
        2**f32.nexp - 1,                          # float32 exponent all ones
        2**f32.nmant - 1,                         # float32 mantissa mask
        1 << (f64.nmant - 1),                     # float64 quiet-NaN bit
        (2**f64.nexp - 1) << f64.nmant,           # float64 exponent all ones
        f64.nmant - f32.nmant,                    # mantissa shift, 29
        (f64.maxexp - 1) - (f32.maxexp - 1),      # exponent re-bias, 896
        f64.nmant,                                # float64 exponent position
    }
    assert _bits(ck.hex_float_literals(widen)) == _bits([f32.smallest_subnormal])
    narrow = functions["fl_f64_to_f32_bits"]
    nan32 = int(np.array([np.nan], dtype=np.float32).view(np.uint32)[0])
    assert set(ck.int_literals(narrow)) == {nan32, f64.bits - 1, f32.bits - 1, 2 ** (f64.bits - 1) - 1}
    assert _bits(ck.hex_float_literals(narrow)) == _bits([f32.smallest_normal, 1 / float(f32.smallest_subnormal)])


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
    ten = np.array([10], dtype=np.int64)
    for seed, expected in ((0, 4004982076), (42, 4279022973)):  # cuDF's values, quoted in the README
        out = np.empty(1, dtype=np.uint32)
        harness.h_murmur3_u64(_ptr(ten), ctypes.c_longlong(1), ctypes.c_uint(seed), _ptr(out))
        assert int(out[0]) == expected


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
