"""Which array library an argument belongs to.

CuPy is never imported here: a CuPy array can only exist once the caller has imported CuPy, so
looking it up in ``sys.modules`` is enough, and ``import feedline.ops`` works without CuPy or a GPU.
"""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np


def loaded_cupy() -> ModuleType | None:
    return sys.modules.get("cupy")


def is_cupy_array(value: object) -> bool:
    cupy = loaded_cupy()
    return cupy is not None and isinstance(value, cupy.ndarray)


def array_module(**arrays: object) -> ModuleType:
    """numpy, or cupy when the arrays are CuPy arrays; TypeError naming them on a mix."""
    for value in arrays.values():  # (all NumPy, the common case on every batch: found without a look-up each)
        if type(value) is not np.ndarray:
            break
    else:
        return np
    on_gpu = {name for name, value in arrays.items() if is_cupy_array(value)}
    if not on_gpu:
        return np
    if len(on_gpu) != len(arrays):
        on_cpu = sorted(set(arrays) - on_gpu)
        raise TypeError(
            f"arrays must all be NumPy or all CuPy; got CuPy for {sorted(on_gpu)} "
            f"and NumPy/other for {on_cpu}"
        )
    return loaded_cupy()
