"""Running feedline's CuPy code paths without a GPU (used by tests/test_ops_emulated_gpu.py and the runner's
GPU-placement test).

The kernels are compiled as plain C++ from exactly the text NVRTC would get: a NumPy-backed stand-in
for ``cupy`` runs the real ``_cuda._module``/``launch``, and its ``RawModule(code=...)`` compiles that
``code`` (``_cuda.kernel_source(file)``, headers inlined) with g++ in a folder holding no headers, so
a difference between the files and what NVRTC compiles shows up here. Each ``__global__`` kernel
becomes a host function whose grid-stride loop runs with one thread. Each launch's arguments are
checked against the kernel's C signature (pointer element types, scalar widths, contiguity), which is
what CuPy needs and does not check itself. Use the ``gpu`` fixture (import it with ``kernels``).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from feedline.ops import _cuda

import cuda_kernels as ck

CXX = shutil.which("g++")

PRELUDE = """
#include <math.h>
#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
struct fl_emulated_dim3 { unsigned int x; };
static const fl_emulated_dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""

POINTER_DTYPES = {
    "unsigned int": {np.dtype(np.uint32), np.dtype(np.int32)},
    "int": {np.dtype(np.int32)},
    "unsigned long long": {np.dtype(np.uint64), np.dtype(np.int64)},
    "long long": {np.dtype(np.int64)},
    "unsigned char": {np.dtype(np.uint8)},
    "float": {np.dtype(np.float32)},
    "double": {np.dtype(np.float64)},
}
SCALARS = {
    "long long": (np.int64, ctypes.c_longlong),
    "unsigned int": (np.uint32, ctypes.c_uint),
    "int": (np.int32, ctypes.c_int),
    "double": (np.float64, ctypes.c_double),
}


class FakeDeviceArray(np.ndarray):
    """Stands in for cupy.ndarray."""


def _dev(result):
    if isinstance(result, np.ndarray) and not isinstance(result, FakeDeviceArray):
        return result.view(FakeDeviceArray)
    return result


def _fake_cupy() -> types.ModuleType:
    fake = types.ModuleType("cupy")
    fake.ndarray = FakeDeviceArray
    for name in ("ascontiguousarray", "empty", "zeros", "arange", "concatenate", "cumsum",
                 "minimum", "searchsorted", "isnan"):
        setattr(fake, name, (lambda fn: lambda *a, **k: _dev(fn(*a, **k)))(getattr(np, name)))
    fake.asarray = lambda a, dtype=None, order=None: _dev(np.asarray(a, dtype=dtype, order=order))
    fake.asnumpy = lambda a: np.asarray(a)
    fake.ones = lambda *a, **k: _dev(np.ones(*a, **k))
    fake.empty_like = lambda *a, **k: _dev(np.empty_like(*a, **k))
    fake.copyto = np.copyto
    fake.float32 = np.float32
    fake.cuda = types.SimpleNamespace(Event=_FakeEvent, get_elapsed_time=lambda a, b: 1e3 * (b.at - a.at),
                                      Device=lambda: types.SimpleNamespace(id=0))
    return fake


class _FakeEvent:
    at = 0.0

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass


class Launches(list):
    """Kernel names in launch order; ``kernels`` holds the (file, kernel) pairs."""

    def __init__(self):
        super().__init__()
        self.kernels: set[tuple[str, str]] = set()


class EmulatedModule:
    def __init__(self, filename: str, library: ctypes.CDLL, signatures: dict[str, tuple[str, ...]]):
        self.filename, self.library, self.signatures = filename, library, signatures


@pytest.fixture(scope="session")
def kernels(tmp_path_factory):
    """``{kernel_source(file): EmulatedModule}``, built from the inlined text of each .cu file."""
    work = tmp_path_factory.mktemp("emulated")  # holds no headers: an #include left in fails
    builds = {}
    for filename in ck.CU_FILES:
        text = _cuda.kernel_source(filename)
        source = work / f"{filename}.cpp"
        source.write_text(PRELUDE + text, encoding="utf-8")
        library = work / f"{filename}.so"
        command = [CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-o", str(library),
                   str(source)]
        builds[filename] = (text, library, subprocess.Popen(
            command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    modules = {}
    for filename, (text, library, process) in builds.items():
        log, _ = process.communicate()
        assert process.returncode == 0, f"{filename}:\n{log}"
        signatures = {k: tuple(v) for k, v in ck.kernel_signatures(text).items()}  # what was built
        assert signatures, f"{filename}: no kernels"
        modules[text] = EmulatedModule(filename, ctypes.CDLL(str(library)), signatures)
    return modules


@pytest.fixture
def gpu(kernels, monkeypatch):
    launched = Launches()

    class RawModule:
        """cupy.RawModule: gets what _cuda._module hands NVRTC."""

        def __init__(self, code, options=(), **unused):
            assert tuple(options) == _cuda.NVRTC_OPTIONS, options
            assert "--fmad=false" in options, "without it NVRTC contracts a*b+c into fma: other bits"
            assert code in kernels, "NVRTC would compile text that is not kernel_source() of any .cu file"
            self.module = kernels[code]

        def get_function(self, name):
            module = self.module
            assert name in module.signatures, f"{name} is not a kernel of {module.filename}"

            def run(grid, block, args):
                assert len(grid) == 1 and 1 <= grid[0] <= _cuda.MAX_GRID, grid
                assert block == (_cuda.BLOCK,) and _cuda.BLOCK <= 1024, block
                params = module.signatures[name]
                assert len(args) == len(params), f"{name}: {len(args)} args for {params}"
                converted = [_convert(name, p, a) for p, a in zip(params, args)]
                getattr(module.library, name)(*converted)
                launched.append(name)
                launched.kernels.add((module.filename, name))

            return run

    fake = _fake_cupy()
    fake.RawModule = RawModule
    monkeypatch.setitem(sys.modules, "cupy", fake)
    _cuda._module.cache_clear()  # the real _module runs, against the fake cupy
    yield launched
    _cuda._module.cache_clear()  # no emulated module may outlive the test


def _convert(kernel: str, param: str, arg):
    declared = " ".join(param.replace("const", "").split()[:-1])
    if declared.endswith("*"):
        element = declared[:-1].strip()
        assert isinstance(arg, FakeDeviceArray), f"{kernel}: {param} got {type(arg).__name__}"
        assert arg.dtype in POINTER_DTYPES[element], f"{kernel}: {param} got dtype {arg.dtype}"
        assert arg.flags.c_contiguous, f"{kernel}: {param} is not C-contiguous"
        return ctypes.c_void_p(arg.ctypes.data)
    numpy_type, c_type = SCALARS[declared]
    assert type(arg) is numpy_type, f"{kernel}: {param} got {type(arg).__name__}"
    return c_type(arg.item())


def dev(array):
    return np.ascontiguousarray(array).view(FakeDeviceArray)


def same_bits(gpu_result, cpu_result):
    assert isinstance(gpu_result, FakeDeviceArray)
    host = np.asarray(gpu_result)
    assert host.dtype == cpu_result.dtype and host.shape == cpu_result.shape
    np.testing.assert_array_equal(host.view(np.uint8), np.ascontiguousarray(cpu_result).view(np.uint8))


