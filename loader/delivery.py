"""What every delivered batch holds whatever it contains: ``valid``, a bool tensor beside ``index`` (on its
device), False for padding and for the slots of skipped samples, so that a loss masked with it works on
every batch. Runners add ``valid`` only where a sample is invalid; this fills it in on the batch thread."""
from __future__ import annotations

from typing import Any, Iterator

import torch


def complete(batch: dict | None) -> int:
    """Give ``batch`` its ``valid`` mask if the runner left it out (every sample valid), and count the valid
    samples (0 for no batch). (``_each_completed``'s step, which a delivered batch takes with no call of this.)"""
    return next(_each_completed(((batch, None),)))[2]


class Delivered:
    """A runner's ``(batch, info)`` stream as ``(batch, info, valid samples, rows)``, each batch completed and its
    rows counted here, on the batch thread (a tensor's ``shape``: microseconds of the trainer's thread otherwise).
    Iterating it runs a generator (a batch then resumes it, where a ``__next__`` method is a Python call of its own)."""

    def __init__(self, batches: Iterator[tuple[dict | None, Any]]):
        self._batches = batches
        self._completed = _each_completed(batches)  # (a function's generator: no cycle through ``self``)

    def __iter__(self) -> Iterator[tuple[dict | None, Any, int, int]]:
        return self._completed

    def __next__(self) -> tuple[dict | None, Any, int, int]:
        return next(self._completed)

    def close(self) -> None:
        self._completed.close()
        self._batches.close()


def _each_completed(batches: Iterator[tuple[dict | None, Any]]) -> Iterator[tuple[dict | None, Any, int, int]]:
    """Each batch with its ``valid`` mask filled in where the runner left it out, its valid samples and its rows
    (worked out here, not in a call per batch: this runs on the batch thread)."""
    for batch, info in batches:
        if batch is None:
            yield batch, info, 0, 0
            continue
        index = batch["index"]
        rows = index.shape[0]  # (len() of a tensor is a Python method: four calls)
        if "valid" in batch:
            yield batch, info, int(batch["valid"].sum()), rows
        else:
            # (Its own tensor each batch: a trainer may write into a batch's. A clone of a kept all-True tensor
            # measured 0.7k instructions more a batch than this, with its checks: callgrind, /tmp/h8/cgm.py deliver.)
            batch["valid"] = torch.ones(rows, dtype=torch.bool, device=index.device)
            yield batch, info, rows, rows
