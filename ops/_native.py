"""The numba kernel modules, loaded on first use: each ``ops`` function that has a native CPU kernel asks
``kernels(name)`` and falls back to its NumPy implementation when it gets None (numba not installed, or
``FEEDLINE_NUMBA=0`` in the environment). The NumPy implementations stay the references the kernels are
tested against."""
from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

ENV = "FEEDLINE_NUMBA"


@functools.lru_cache(maxsize=None)
def kernels(name: str) -> ModuleType | None:
    """``feedline.ops._<name>_numba``, or None where numba is missing or switched off."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        import numba  # noqa: F401
    except ImportError:
        return None
    return importlib.import_module(f"{__package__}._{name}_numba")
