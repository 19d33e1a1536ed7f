"""What the Loader asks of a pipeline runner. One runner per kind of source (images on DALI, features on
NumPy/CuPy); the Loader owns epochs, order, sharding and state, the runner owns turning sample indices into
torch tensors for one placement."""
from __future__ import annotations

from typing import Iterator, Protocol

import torch

from .sampler import BatchPlan


class Runner(Protocol):
    num_samples: int

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[dict[str, torch.Tensor]]:
        """One dict per plan, in order. The runner may read ahead in ``plans`` to overlap work, but must
        yield exactly one batch for every plan it takes, whose ``index`` tensor equals ``plan.indices``."""
        ...

    def close(self) -> None:
        ...
