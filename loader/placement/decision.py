"""A placement decision: the cut, the CPU threads and the prefetch depth chosen, what they are predicted to give,
and why each stage runs where it does."""
from __future__ import annotations

from dataclasses import dataclass

from ...pipelines.stage import Backend
from .monitors import GpuReading


@dataclass(frozen=True)
class Prediction:
    """Seconds per sample of each resource (cpu: on its threads; gpu: on the GPU time the trainer leaves;
    thread: on the one batch thread), the resulting throughput, and the load the pipeline adds: CPU
    core-seconds and idle-GPU seconds per sample, and GPU bytes it needs."""

    cpu_s_per_sample: float
    gpu_s_per_sample: float
    transfer_s_per_sample: float
    samples_per_s: float
    bottleneck: str
    cpu_core_s_per_sample: float
    gpu_busy_s_per_sample: float
    gpu_memory_bytes: float
    thread_s_per_sample: float = 0.0


@dataclass(frozen=True)
class StagePlacement:
    stage: str
    backend: Backend
    reason: str


@dataclass(frozen=True)
class PlacementDecision:
    cut: int
    threads: int
    prefetch: int
    placement: str
    batch_size: int
    prediction: Prediction
    stages: tuple[StagePlacement, ...]
    reason: str
    feasible: bool = True

    @property
    def samples_per_s(self) -> float:
        return self.prediction.samples_per_s

    @property
    def key(self) -> tuple[int, int]:
        return self.cut, self.threads


@dataclass(frozen=True)
class Move:
    time: float
    old: PlacementDecision | None
    new: PlacementDecision
    reason: str


def trainer_load(process_cores_busy: float, gpu: GpuReading | None, decision: PlacementDecision,
                 samples_per_s: float) -> tuple[float, float]:
    """(trainer's busy cores, trainer's GPU busy fraction): what the readings show less the pipeline's own
    load at ``samples_per_s`` under ``decision``, for ``Resources``."""
    cores = max(0.0, process_cores_busy - decision.prediction.cpu_core_s_per_sample * samples_per_s)
    if gpu is None:
        return cores, 0.0
    return cores, min(1.0, max(0.0, gpu.utilization - decision.prediction.gpu_busy_s_per_sample * samples_per_s))
