"""What every delivered batch holds whatever it contains: ``valid``, a bool tensor beside ``index`` (on its
device), False for padding and for the slots of skipped samples, so that a loss masked with it works on
every batch. Runners add ``valid`` only where a sample is invalid; this fills it in on the batch thread.

A stream's masks on the CPU are kept and filled again once nothing but this module holds one (no tensor, no view
of its storage), as the runners' output buffers are (``runners.buffers``): freeing a fresh mask was the costliest
part of a trainer's dropping its batch (~9 us of its thread after a 5 ms step, /tmp/h3/free.py), and a trainer
drops one per step. A mask the trainer still holds is never written."""
from __future__ import annotations

import sys
from typing import Any, Iterator

import torch

KEPT_MASKS = 8  # a stream's masks kept for reuse: more than it has in flight (prefetch, the trainer's, the making)
_storage_uses = torch._C._storage_Use_Count


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
        self._completed = _each_completed(batches, KEPT_MASKS)  # (a function's generator: no cycle through ``self``)

    def __iter__(self) -> Iterator[tuple[dict | None, Any, int, int]]:
        return self._completed

    def __next__(self) -> tuple[dict | None, Any, int, int]:
        return next(self._completed)

    def close(self) -> None:
        self._completed.close()
        self._batches.close()


def _each_completed(batches: Iterator[tuple[dict | None, Any]], keep: int = 0
                    ) -> Iterator[tuple[dict | None, Any, int, int]]:
    """Each batch with its ``valid`` mask filled in where the runner left it out, its valid samples and its rows
    (worked out here, not in a call per batch: this runs on the batch thread); up to ``keep`` CPU masks kept for
    reuse."""
    kept: list[torch.Tensor] = []
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
            valid = None
            for k in range(len(kept)):  # (no loop variable: it would hold one more reference)
                # 2 references: the list's and getrefcount's; 2 uses of the storage: the mask's and the one asked
                if sys.getrefcount(kept[k]) == 2 and kept[k].shape[0] == rows \
                        and _storage_uses(kept[k].untyped_storage()._cdata) <= 2:
                    valid = kept.pop(k).fill_(True)
                    break
            if valid is None:
                valid = torch.ones(rows, dtype=torch.bool, device=index.device)
            if keep and valid.is_cpu:
                kept.append(valid)  # (the newest last: the oldest, looked at first, are the likeliest let go)
                if len(kept) > keep:
                    del kept[0]
            batch["valid"] = valid
            yield batch, info, rows, rows
