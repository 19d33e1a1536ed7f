"""What the plans of the batch-wide ops (``HashPlan``, ``DensePlan``) share: the raw rows they read, the check of
the raw batch they are given, and their arrays copied to each GPU once."""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np


class RawRowsPlan:
    """A plan reading rows ``self.sources`` of a feature-major batch ``raw`` [rows, B]; ``self._device`` holds
    its arrays by device."""

    sources: np.ndarray
    _device: dict

    @functools.cached_property
    def reads(self) -> int:
        """Raw rows the plan needs (one more than the largest it reads)."""
        return int(self.sources.max()) + 1 if self.sources.size else 0

    def check_raw(self, raw, dtype) -> None:
        """``raw`` is 2-D ``dtype`` with every row the plan reads."""
        if raw.dtype != dtype or raw.ndim != 2:
            raise TypeError(f"raw must be a 2-D {np.dtype(dtype).name} array, got {raw.dtype} with shape {raw.shape}")
        if self.reads > raw.shape[0]:
            raise ValueError(f"plan reads raw row {self.reads - 1}, but raw has {raw.shape[0]} rows")

    def _copied(self, cupy, arrays: Callable[[], tuple]) -> tuple:
        """``arrays()`` on the current device, copied there the first time it is asked for."""
        device = cupy.cuda.Device().id
        if device not in self._device:
            self._device[device] = tuple(cupy.asarray(a) for a in arrays())
        return self._device[device]
