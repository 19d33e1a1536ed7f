"""Is there a GPU this process can use? Every answer here is safe to ask on a machine without CUDA."""
from __future__ import annotations

import functools
import os
import re

import torch


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask), not all the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        return bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception:  # a broken driver is the same as no GPU for placement purposes
        return False


def parse_device(device: str | torch.device | None) -> torch.device:
    """The torch device batches are delivered on; ``None`` means the CPU."""
    if device is None:
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or a CUDA device, got {device!r}")
    if dev.type == "cuda" and not gpu_available():
        raise ValueError(f"device={device!r} was requested but this machine has no usable CUDA GPU")
    return dev


# What CUDA, torch, CuPy, nvJPEG and DALI say when the GPU itself fails (seen in their messages, e.g. DALI's
# "CUDA allocation failed", "Can't allocate N bytes on device 0", 'NVJPEG error "5" :
# NVJPEG_STATUS_ALLOCATOR_FAILURE', "CUDA runtime API error cudaErrorIllegalAddress (700)").
_GPU_FAILURE_WORDS = ("out of memory", "cuda error", "cudaerror", "device-side", "no cuda-capable device",
                      "cuda driver", "nvjpeg", "device lost", "gpu is lost", "illegal memory access",
                      "cuda allocation failed", "cuda runtime api error", "cuda_error")
_DEVICE_ALLOCATION = re.compile(r"can't allocate \d+ bytes on device")


def is_gpu_failure(exc: BaseException) -> bool:
    """An error that means the GPU itself failed (out of memory, lost device), not bad data or a bug."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, MemoryError)) and (any(w in text for w in _GPU_FAILURE_WORDS)
                                                             or _DEVICE_ALLOCATION.search(text) is not None)
