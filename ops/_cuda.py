"""Loading and launching the CUDA kernels kept as ``.cu`` files next to this module.

``#include "x.cuh"`` lines naming files in this folder are inlined before compiling, so the source
handed to NVRTC is self-contained and CuPy's kernel cache (keyed on the source text) notices header
edits. The same files compile unchanged with ``nvcc -I <this folder>``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parent
# fmad=false: no multiply-add contraction, so float arithmetic rounds exactly like NumPy's. CuPy
# appends -ftz=true to every compile, so the kernels avoid float32 operations on subnormal values
# (float_bits.cuh); tests/test_cuda_sources.py checks the PTX for flushing instructions.
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true")
BLOCK = 256
MAX_GRID = 65535 * 32

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.MULTILINE)


def kernel_source(filename: str) -> str:
    """The text of ``filename`` with local includes inlined (each header once)."""
    seen: set[str] = set()

    def expand(name: str) -> str:
        if name in seen:
            return ""
        seen.add(name)
        text = _PRAGMA_ONCE.sub("", (KERNEL_DIR / name).read_text(encoding="utf-8"))
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

    return expand(filename)


@functools.lru_cache(maxsize=None)
def _module(filename: str):
    import cupy

    return cupy.RawModule(code=kernel_source(filename), options=NVRTC_OPTIONS)


def launch(filename: str, kernel: str, n: int, args: tuple) -> None:
    """Run ``kernel`` from ``filename`` over ``n`` items (grid-stride loops in the kernels)."""
    if n == 0:
        return
    grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
    _module(filename).get_function(kernel)((grid,), (BLOCK,), args)
