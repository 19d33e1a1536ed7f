"""What numba compiled in this process: the signatures of feedline's numba functions that missed the disk cache,
and the seconds compiles took, so that a benchmark can tell a new install's one-time compile from its timing."""
from __future__ import annotations

import sys
import time

_ROOT = __name__.split(".")[0]


def compiled_kernels() -> dict[str, int]:
    """The signatures this process has compiled for feedline's numba functions (kernels and their helpers:
    numba's cache misses), by function name (``module.function``); empty before numba is imported. Loads from
    the disk cache are not counted."""
    if "numba" not in sys.modules:
        return {}
    from numba.core.dispatcher import Dispatcher

    seen, counts = set(), {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == _ROOT or name.startswith(_ROOT + ".")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher) and id(value) not in seen:
                seen.add(id(value))
                misses = sum(getattr(value, "_cache_misses", {}).values())
                if misses:
                    function = value.py_func
                    counts[f"{function.__module__}.{function.__qualname__}"] = misses
    return counts


def compiled_since(before: dict[str, int]) -> dict:
    """``kernels_compiled_in_timing``: the signatures compiled since :func:`compiled_kernels` gave ``before``,
    and where there are any, ``kernels_compiled_in_timing_names``."""
    now = compiled_kernels()
    grown = {name: n - before.get(name, 0) for name, n in now.items() if n > before.get(name, 0)}
    keys = {"kernels_compiled_in_timing": sum(grown.values())}
    if grown:
        keys["kernels_compiled_in_timing_names"] = sorted(grown)
    return keys


def compile_timer():
    """A numba event listener whose ``seconds`` sums the outermost compiles (a kernel's compile compiles its
    helpers inside it; numba compiles under one lock, so one at a time)."""
    from numba.core import event

    class CompileTimer(event.Listener):
        seconds, depth, began = 0.0, 0, 0.0

        def on_start(self, ev) -> None:
            if self.depth == 0:
                self.began = time.perf_counter()
            self.depth += 1

        def on_end(self, ev) -> None:
            self.depth -= 1
            if self.depth == 0:
                self.seconds += time.perf_counter() - self.began

    return CompileTimer()
