"""What the Loader asks of a pipeline runner. One runner per kind of source (images on DALI and torch,
features on NumPy/CuPy); the Loader owns epochs, order, sharding and state, a runner turns batch plans into
torch tensors for one placement.

A runner's whole job runs on whichever thread iterates ``batches``: it touches no thread-local state of the
caller, so the Loader may drive it from a thread of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Protocol

import torch

from ..errors import OnError, Skipped
from ..sampler import BatchPlan


@dataclass(frozen=True)
class BatchInfo:
    """Where a batch leaves its epoch: ``end`` is the next sample position in this rank's order, ``last``
    whether the epoch is over, ``skipped`` how many samples were left out while making it."""

    epoch: int
    end: int
    last: bool
    skipped: int = 0


@dataclass(frozen=True)
class RunnerConfig:
    """One placement of a pipeline, and how hard to work at it."""

    cut: int
    device: torch.device
    batch_size: int
    seed: int = 0
    num_threads: int = 1
    prefetch: int = 2
    on_error: OnError = OnError.RAISE
    max_pixels: int = 1 << 27
    max_batch_pixels: int | None = None  # decoded pixels per image batch (None: runners.images.default_batch_pixels)
    # Each plan makes its own batch, from its own samples only (a bad one's slot becomes padding rather than
    # being filled from the next plan's): plans can then be made in different processes, in any order.
    isolated_plans: bool = False


@dataclass(frozen=True)
class StageTimes:
    """What ``Runner.profile`` measured over ``samples`` samples: per stage, thread-seconds on the CPU or
    synchronised seconds on the GPU, and bytes out per sample; ``together`` holds stages timed only as a
    group (their seconds together), and ``source_bytes_per_sample`` what the source read."""

    samples: int
    seconds: Mapping[str, float]
    bytes_out: Mapping[str, float]
    source_bytes_per_sample: float
    together: Mapping[tuple[str, ...], float] = field(default_factory=dict)


class Runner(Protocol):
    skipped: list[Skipped]  # every sample left out, once each, in the order met

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict | None, BatchInfo]]:
        """``(batch, info)`` in plan order. A runner may read ahead in ``plans`` and may form its own batches
        from the plans' samples (to fill a batch past a bad sample); ``batch`` is then None for an epoch end
        with nothing left to deliver. Closing the generator stops all work it started."""
        ...

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """Make the plans' batches on this placement, timing every stage (the profiler's hook)."""
        ...

    def close(self) -> None:
        ...
