"""What a placement decision is made from: each stage's measured cost, what the trainer leaves of the machine, and
how long the trainer waits. Plain checked values, so tests build them by hand (synthetic or recorded readings)."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ...pipelines.validate import finite_at_least, int_at_least
from .monitors import GpuReading, WaitReading

MIN_CPU_SHARE = 0.5             # cores the OS still gives the pipeline on a fully busy machine
DEFAULT_H2D_BYTES_PER_S = 12e9  # PCIe 3.0 x16 as measured in practice; used where no GPU was measured
MIN_WAIT_BATCHES = 8            # fewer measured batches than this say nothing about the trainer


def _optional_number(name: str, value) -> float | None:
    return None if value is None else finite_at_least(name, value, 0.0)


@dataclass(frozen=True)
class StageCost:
    """Measured cost of one stage: seconds per sample on one CPU thread (its CPU time and the time it blocks
    the thread), seconds per sample on an idle GPU (None where it cannot run or was not measured), and bytes
    it outputs per sample. ``blocked_s_per_sample``: the part of the CPU seconds spent off the CPU (sleeping,
    waiting on I/O) on the batch thread: it holds that thread but no core."""

    stage: str
    cpu_s_per_sample: float | None
    gpu_s_per_sample: float | None
    bytes_out_per_sample: float
    blocked_s_per_sample: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError(f"stage must be a non-empty stage name, got {self.stage!r}")
        cpu = _optional_number("cpu_s_per_sample", self.cpu_s_per_sample)
        _optional_number("gpu_s_per_sample", self.gpu_s_per_sample)
        finite_at_least("bytes_out_per_sample", self.bytes_out_per_sample, 0.0)
        blocked = finite_at_least("blocked_s_per_sample", self.blocked_s_per_sample, 0.0)
        if blocked > (cpu or 0.0):
            raise ValueError(f"blocked_s_per_sample ({blocked!r}) is part of cpu_s_per_sample ({cpu!r}) and cannot "
                             f"exceed it")

    @property
    def core_s_per_sample(self) -> float | None:
        """CPU seconds per sample on a core (the stage's time less its blocking)."""
        return None if self.cpu_s_per_sample is None else self.cpu_s_per_sample - self.blocked_s_per_sample


@dataclass(frozen=True)
class BatchCosts:
    """What making a batch costs beyond its samples' stage costs, in seconds per batch (a batch of any size:
    the model divides by its batch size). ``cpu_s``: core-seconds of forming and assembling it (the runner's
    batch path less its stages); ``thread_s``: the batch thread's own CPU time per batch (stages on that thread
    included), which no other thread can share; ``delivery_s``: handing it from the batch thread to the
    trainer's (the queue, the wake-up); ``transfer_s``: the fixed part of its copies to the GPU (one
    latency per tensor), beside the bytes over the bandwidth."""

    cpu_s: float = 0.0
    thread_s: float = 0.0
    delivery_s: float = 0.0
    transfer_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("cpu_s", "thread_s", "delivery_s", "transfer_s"):
            finite_at_least(name, getattr(self, name), 0.0)


@dataclass(frozen=True)
class Resources:
    """What the trainer leaves to the pipeline. ``trainer_*`` exclude the pipeline's own load (see
    ``decision.trainer_load``). ``gpu_memory_needed_per_batch`` maps a cut to measured GPU bytes per batch; cuts
    missing from it are estimated from the stages' bytes. ``gpu_memory_held_bytes`` is what the pipeline
    holds on the GPU now, free to it when it re-plans."""

    cores: int
    trainer_cpu_cores_busy: float
    gpu: GpuReading | None
    trainer_gpu_busy_fraction: float = 0.0
    h2d_bytes_per_s: float = DEFAULT_H2D_BYTES_PER_S
    d2h_bytes_per_s: float | None = None
    gpu_memory_needed_per_batch: Mapping[int, float] | None = None
    gpu_memory_held_bytes: float = 0.0

    def __post_init__(self) -> None:
        int_at_least("cores", self.cores, 1)
        finite_at_least("trainer_cpu_cores_busy", self.trainer_cpu_cores_busy, 0.0)
        if self.gpu is not None and not isinstance(self.gpu, GpuReading):
            raise TypeError(f"gpu must be a GpuReading or None, got {type(self.gpu).__name__}")
        busy = finite_at_least("trainer_gpu_busy_fraction", self.trainer_gpu_busy_fraction, 0.0)
        if busy > 1.0:
            raise ValueError(f"trainer_gpu_busy_fraction must be in [0, 1], got {busy!r}")
        if finite_at_least("h2d_bytes_per_s", self.h2d_bytes_per_s, 0.0) == 0.0:
            raise ValueError("h2d_bytes_per_s must be > 0")
        if _optional_number("d2h_bytes_per_s", self.d2h_bytes_per_s) == 0.0:
            raise ValueError("d2h_bytes_per_s must be > 0 or None (same as h2d)")
        finite_at_least("gpu_memory_held_bytes", self.gpu_memory_held_bytes, 0.0)
        if self.gpu_memory_needed_per_batch is not None:
            needed = dict(self.gpu_memory_needed_per_batch)
            for cut, value in needed.items():
                int_at_least("gpu_memory_needed_per_batch key (a cut)", cut, 0)
                finite_at_least(f"gpu_memory_needed_per_batch[{cut}]", value, 0.0)
            object.__setattr__(self, "gpu_memory_needed_per_batch", MappingProxyType(needed))

    @property
    def free_cores(self) -> float:
        return max(self.cores - self.trainer_cpu_cores_busy, MIN_CPU_SHARE)


@dataclass(frozen=True)
class Measurements:
    """One set of inputs to a decision. ``samples_per_s`` is the measured throughput of the current plan;
    ``batch`` what each batch costs beyond its samples."""

    costs: tuple[StageCost, ...]
    source_bytes_per_sample: float
    resources: Resources
    wait: WaitReading | None = None
    samples_per_s: float | None = None
    batch: BatchCosts = BatchCosts()

    def __post_init__(self) -> None:
        costs = tuple(self.costs)
        if not all(isinstance(c, StageCost) for c in costs):
            raise TypeError("costs must hold StageCost values")
        object.__setattr__(self, "costs", costs)
        finite_at_least("source_bytes_per_sample", self.source_bytes_per_sample, 0.0)
        if not isinstance(self.resources, Resources):
            raise TypeError(f"resources must be a Resources, got {type(self.resources).__name__}")
        if self.wait is not None and not isinstance(self.wait, WaitReading):
            raise TypeError(f"wait must be a WaitReading or None, got {type(self.wait).__name__}")
        _optional_number("samples_per_s", self.samples_per_s)
        if not isinstance(self.batch, BatchCosts):
            raise TypeError(f"batch must be a BatchCosts, got {type(self.batch).__name__}")

    def demand_samples_per_s(self, batch_size: int) -> float | None:
        """Samples per second the trainer would take if it never waited; None until measured."""
        w = self.wait
        if w is None or w.batches < MIN_WAIT_BATCHES or w.mean_step_s <= 0.0:
            return None
        return batch_size / w.mean_step_s
