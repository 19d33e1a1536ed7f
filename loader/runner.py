"""What the Loader asks of a pipeline runner. One runner per kind of source (images on DALI, features on
NumPy/CuPy); the Loader owns epochs, order, sharding and state, the runner owns turning sample indices into
torch tensors for one placement."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from .sampler import BatchPlan


@dataclass(frozen=True)
class BatchInfo:
    """Where a delivered batch leaves its epoch: the next sample position in this rank's order, and whether
    the epoch is over."""

    epoch: int
    end: int
    last: bool


class Runner(Protocol):
    num_samples: int

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[dict[str, torch.Tensor]]:
        """One dict per plan, in order. The runner may read ahead in ``plans`` to overlap work, but must
        yield exactly one batch for every plan it takes, whose ``index`` tensor equals ``plan.indices``.

        A runner with ``yields_info = True`` instead yields ``(batch, BatchInfo)`` and may form its own batches
        from the plans' samples (to fill a batch past a bad sample); ``batch`` may then be None for an epoch
        end with nothing left to deliver."""
        ...

    def close(self) -> None:
        ...
