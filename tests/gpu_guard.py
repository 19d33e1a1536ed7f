"""When a GPU test runs. A test marked ``gpu`` is skipped only where the machine has no NVIDIA GPU, found without
asking torch or CuPy (NVML, the ``/dev/nvidiaN`` device files, ``CUDA_VISIBLE_DEVICES``). Where a GPU is, a
torch or CuPy that cannot use it fails the test loudly: a broken CUDA install must never read as "no GPU"."""
from __future__ import annotations

import functools
import glob
import os

import pytest

HIDING = ("", "-1", "none", "nodevfiles")


@functools.lru_cache(maxsize=1)
def visible_gpus() -> tuple[int, str]:
    """How many NVIDIA GPUs this process is meant to use, and how that was found."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip().lower() in HIDING:
        return 0, f"CUDA_VISIBLE_DEVICES={hidden!r} hides every GPU"
    files = sorted(glob.glob("/dev/nvidia[0-9]*"))
    try:
        import pynvml
    except ImportError:
        return (len(files), f"{len(files)} /dev/nvidiaN device file(s); nvidia-ml-py is not installed") if files \
            else (0, "no NVIDIA GPU: no /dev/nvidiaN device file, and nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as e:
        if files:
            return len(files), f"{len(files)} /dev/nvidiaN device file(s), but NVML fails: {e}"
        return 0, f"no NVIDIA GPU: no /dev/nvidiaN device file, and NVML says: {e}"
    except pynvml.NVMLError as e:  # a driver that is there but fails: a GPU machine with a problem to report
        return max(1, len(files)), f"NVML fails on this GPU machine: {e}"
    return count, f"NVML sees {count} GPU(s)"


def torch_cuda_problem() -> str | None:
    """Why torch cannot use the GPU that is there, or None."""
    import torch

    try:
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return None
        why = "torch.cuda.is_available() is False"
    except Exception as e:
        why = f"torch.cuda raised {type(e).__name__}: {e}"
    return (f"{visible_gpus()[1]}, but {why} (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
            f"torch's CUDA is broken here, or a CPU-only torch is installed")


def before_gpu_test() -> None:
    """Skip where there is no GPU; fail where there is one that torch cannot use; else let the test run."""
    count, how = visible_gpus()
    if count == 0:
        pytest.skip(f"needs a GPU; {how}")
    trouble = torch_cuda_problem()
    if trouble is not None:
        pytest.fail(f"a GPU test cannot run on this GPU machine: {trouble}", pytrace=False)


def cupy_where_gpu():
    """CuPy on a machine with a GPU (any error importing it or reaching the device is raised: loud); elsewhere
    CuPy if it imports, else None (the tests that use it are skipped there)."""
    if visible_gpus()[0] == 0:
        try:
            import cupy
        except ImportError:
            return None
        return cupy
    import cupy

    cupy.cuda.runtime.getDeviceCount()
    return cupy


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None:
        before_gpu_test()
