"""Epoch after epoch of one loader, as one stream (benchmarks, profiling probes, measuring a plan)."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator


def endless(make: Callable[[], Iterable]) -> Iterator:
    """Batches from ``make()``, then from ``make()`` again, forever: pass ``lambda: loader`` for a Loader or a
    DataLoader (each iteration is an epoch), or a function returning a fresh generator."""
    while True:
        empty = True
        for batch in make():
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yields no batches: an empty epoch cannot be repeated")
