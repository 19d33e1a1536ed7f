"""Epoch after epoch of one loader as one stream, and timing it (benchmarks, ``feedline plan``)."""
from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

from ..pipelines.validate import int_at_least, positive_int


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


def measure_loader(
    iterable_factory: Callable[[], Iterable],
    batches: int,
    warmup: int,
    *,
    sync: Callable[[], None] | None = None,
) -> dict:
    """Samples per second over ``batches`` batches taken after ``warmup`` untimed ones.

    ``iterable_factory()`` gives an iterable of batches; when it is exhausted the factory is called
    again (for a DataLoader, ``lambda: loader`` starts the next epoch). A batch is a tensor or
    array, or a dict, tuple or list of them; its size is the first dimension of its first element.
    ``sync``, if given, runs before the clock stops (e.g. ``torch.cuda.synchronize``).
    """
    if not callable(iterable_factory):
        raise TypeError(
            f"iterable_factory must be a callable returning an iterable, "
            f"got {type(iterable_factory).__name__}"
        )
    batches = positive_int("batches", batches)
    warmup = int_at_least("warmup", warmup, 0)
    batch_iter = endless(iterable_factory)
    for _ in range(warmup):
        next(batch_iter)
    if sync is not None:
        sync()

    samples = 0
    started = time.perf_counter()
    for _ in range(batches):
        samples += batch_size_of(next(batch_iter))
    if sync is not None:
        sync()
    seconds = time.perf_counter() - started
    return {
        "samples_per_s": samples / seconds,
        "batches": batches,
        "samples": samples,
        "seconds": seconds,
    }


def batch_size_of(batch) -> int:
    """First dimension of the first tensor in a batch (tensor, array, dict, tuple or list)."""
    first = batch
    while isinstance(first, (dict, tuple, list)):
        if not first:
            raise ValueError("cannot count samples in an empty batch")
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    shape = getattr(first, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(first)
