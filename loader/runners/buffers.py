"""Output buffers reused in rotation once the trainer has let go of them.

A fresh 38 MB batch tensor costs a page fault per 4 KB on first touch (measured here: 0.4 ms per image for
float32 224x224 output, against 0.08 ms when the memory is reused). A buffer goes back into rotation only
when nothing but this pool refers to it: no Python reference to the tensor and no view of its storage. A
trainer that keeps its batches therefore keeps distinct tensors, as with any DataLoader. Threads may take
buffers from one pool at the same time.
"""
from __future__ import annotations

import sys
import threading

import torch

from ...pipelines.validate import int_at_least

# When only the pool holds a tensor, _free sees 3 references to it (the pool's list, its own argument and
# getrefcount's) and 2 to its storage (the tensor's and the storage object asked for here).
_TENSOR_REFS = 3
_STORAGE_REFS = 2


def _free(tensor: torch.Tensor) -> bool:
    return sys.getrefcount(tensor) <= _TENSOR_REFS and \
        torch._C._storage_Use_Count(tensor.untyped_storage()._cdata) <= _STORAGE_REFS


class BufferRing:
    """Keeps up to ``capacity`` tensors of each shape and dtype asked for."""

    def __init__(self, capacity: int):
        self.capacity = int_at_least("capacity", capacity, 0)
        self._buffers: dict[tuple, list[torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.reused = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        with self._lock:
            kept = self._buffers.setdefault((tuple(shape), dtype), [])
            for k in range(len(kept)):  # no loop variable: it would hold one more reference
                if _free(kept[k]):
                    self.reused += 1
                    return kept[k]
            tensor = torch.empty(shape, dtype=dtype)
            if len(kept) < self.capacity:
                kept.append(tensor)
            return tensor
