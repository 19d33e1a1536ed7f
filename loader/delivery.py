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


# A CPU batch's all-True ``valid`` is a copy of this one, never handed out itself (a trainer may write into a batch's
# tensors): ``clone`` costs ~30% fewer instructions than ``torch.ones`` (its arguments parsed, then filled) on the
# batch thread. Only its rows change it (an epoch's last, partial batch). On a GPU ``torch.ones`` as before: a copy
# would read a tensor made on another stream.
_all_valid = torch.ones(0, dtype=torch.bool)


class Delivered:
    """A runner's ``(batch, info)`` stream as ``(batch, info, valid samples)``, each batch completed. Iterating it
    runs a generator (a batch then resumes it, where a ``__next__`` method is a Python call of its own)."""

    def __init__(self, batches: Iterator[tuple[dict | None, Any]]):
        self._batches = batches
        self._completed = _each_completed(batches)  # (a function's generator: no cycle through ``self``)

    def __iter__(self) -> Iterator[tuple[dict | None, Any, int]]:
        return self._completed

    def __next__(self) -> tuple[dict | None, Any, int]:
        return next(self._completed)

    def close(self) -> None:
        self._completed.close()
        self._batches.close()


def _each_completed(batches: Iterator[tuple[dict | None, Any]]) -> Iterator[tuple[dict | None, Any, int]]:
    """Each batch with its ``valid`` mask filled in where the runner left it out, and its valid samples (worked out
    here, not in a call per batch: this runs on the batch thread)."""
    global _all_valid
    for batch, info in batches:
        if batch is None:
            yield batch, info, 0
        elif "valid" in batch:
            yield batch, info, int(batch["valid"].sum())
        else:
            index = batch["index"]
            rows = index.shape[0]  # (len() of a tensor is a Python method: four calls)
            device = index.device
            if device.type != "cpu":
                batch["valid"] = torch.ones(rows, dtype=torch.bool, device=device)
            else:
                kept = _all_valid  # (one read: another loader's batch thread may replace it)
                if kept.shape[0] != rows:
                    kept = _all_valid = torch.ones(rows, dtype=torch.bool)
                batch["valid"] = kept.clone()
            yield batch, info, rows
