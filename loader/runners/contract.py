"""What the Loader asks of a pipeline runner. One runner per kind of source (images on DALI and torch,
features on NumPy/CuPy); the Loader owns epochs, order, sharding and state, a runner turns batch plans into
torch tensors for one placement.

A runner's whole job runs on whichever thread iterates ``batches``: it touches no thread-local state of the
caller, so the Loader may drive it from a thread of its own.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Protocol

import torch

from ..cache_policy import CacheMode, CacheSettings
from ..errors import OnError, Skipped
from ..sampler import BatchPlan


@dataclass(frozen=True, init=False)
class BatchInfo:
    """Where a batch leaves its epoch: ``end`` is the next sample position in this rank's order, ``last``
    whether the epoch is over, ``skipped`` how many samples were left out while making it."""

    epoch: int
    end: int
    last: bool
    skipped: int = 0

    def __init__(self, epoch: int, end: int, last: bool, skipped: int = 0):
        # (As ``BatchPlan``'s: the fields written into the instance's dict, not set by four object.__setattr__
        # calls as a frozen dataclass's own __init__ does; one per batch, on the batch thread.)
        fields = self.__dict__
        fields["epoch"], fields["end"], fields["last"], fields["skipped"] = epoch, end, last, skipped


class SkipFill(enum.Enum):
    """Which samples share a batch when ``on_error="skip"`` leaves a bad sample out of its plan's batch.

    ``FROM_LATER_SAMPLES`` (the local default): the bad sample's slot is filled from the next good samples of
    the epoch, so a batch has its planned size while the epoch has samples left; the batches after it start
    later in the order, and only the epoch's last batches can be padding (label and index -1,
    ``valid`` False), so that every rank makes exactly its planned batches.

    ``PADDING``: each plan's batch is made from its own samples only, its good samples first and a padding
    row for each bad one. A batch is then a pure function of its plan, so plans can be made in different
    processes and in any order (remote workers need this) and still give the same batches."""

    FROM_LATER_SAMPLES = "from later samples"
    PADDING = "padding"


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
    max_batch_pixels: int | None = None  # decoded pixels per image batch (None: image runner's default_batch_pixels)
    skip_fill: SkipFill = SkipFill.FROM_LATER_SAMPLES
    cache: CacheSettings = CacheSettings(CacheMode.OFF)  # the Loader's ``cache`` (its default: "auto")


def busy_time() -> float:
    """Seconds this thread has been running or waiting off the CPU by its own doing (sleeping, reading a file,
    waiting on a lock): the wall clock less the time it was ready to run but waited for a core (the kernel's
    run-queue wait, ``/proc/thread-self/schedstat``). A stage that sleeps counts its sleep; one preempted by
    other work on a busy machine does not count the preemption. Where the kernel does not tell, this thread's
    CPU time."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            waited_ns = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return time.thread_time()
    return time.perf_counter() - waited_ns * 1e-9


class StageTimer:
    """Seconds per stage, added up for a profiling caller. The caller makes one and passes it to a runner's
    batch path, which calls it around every stage whether timed or not: ``NO_TIMER``, the default, does
    nothing. ``clock`` is this thread's CPU time unless given (``time.perf_counter`` for stages timed end
    to end around a synchronised device). With that default, a stage timed by ``start``/``stop`` also adds to
    ``blocked`` the time it held its thread off the CPU (sleeping, waiting on I/O: ``busy_time`` less the CPU
    time), which ``seconds`` does not hold. ``timing`` says whether anything is timed, for work done only to
    be timed (a device synchronisation, a share of a fused stage's time)."""

    timing = True

    def __init__(self, clock: Callable[[], float] = time.thread_time):
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.blocked: dict[str, float] = {}
        self._busy_at: float | None = None

    def start(self) -> float:
        """The clock now, for ``stop``."""
        self._busy_at = busy_time() if self.clock is time.thread_time else None
        return self.clock()

    def stop(self, stage: str, started: float) -> float:
        """Adds the time since ``started`` to ``stage``; returns the clock now (the start of what follows)."""
        now = self.clock()
        self.add(stage, now - started)
        if self._busy_at is not None:
            busy = busy_time()
            self.blocked[stage] = self.blocked.get(stage, 0.0) + max(0.0, (busy - self._busy_at) - (now - started))
            self._busy_at = busy
        return now

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


class _NoTimer(StageTimer):
    timing = False

    def start(self) -> float:
        return 0.0

    def stop(self, stage: str, started: float) -> float:
        return 0.0

    def add(self, stage: str, seconds: float) -> None:
        pass


NO_TIMER: StageTimer = _NoTimer()


@dataclass(frozen=True)
class StageTimes:
    """What ``Runner.profile`` measured over ``samples`` samples: per stage, thread-seconds on the CPU or
    synchronised seconds on the GPU, and bytes out per sample; ``together`` holds stages timed only as a
    group (their seconds together), and ``source_bytes_per_sample`` what the source read; ``blocked`` the time a
    CPU stage held its thread off the CPU beside its ``seconds`` (a stage that sleeps or waits on I/O), where
    that was measured."""

    samples: int
    seconds: Mapping[str, float]
    bytes_out: Mapping[str, float]
    source_bytes_per_sample: float
    together: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    blocked: Mapping[str, float] = field(default_factory=dict)


class Runner(Protocol):
    skipped: list[Skipped]  # its SkipLog's list (the Loader's, or its own): every sample left out, once, in order met

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict | None, BatchInfo]]:
        """``(batch, info)`` in plan order. A runner may read ahead in ``plans`` and may form its own batches
        from the plans' samples (to fill a batch past a bad sample, see ``SkipFill``); ``batch`` is then None
        for an epoch end with nothing left to deliver. Closing the generator stops all work it started. A
        runner may take a ``timer`` (``StageTimer``) here too, for a profiling caller."""
        ...

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """Make the plans' batches on this placement, timing every stage (the profiler's hook)."""
        ...

    def close(self) -> None:
        ...
