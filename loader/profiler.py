"""A short profiling run: what each stage costs on each backend, what it outputs, and what the source reads.

Costs are measured on one thread over a few batches of the dataset's first samples, outside any epoch, so
profiling never consumes or reorders what the trainer is given. GPU costs are measured only where a GPU is.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..pipelines.image import ImageOutput
from ..pipelines.image_files import ImageFiles
from ..pipelines.spec import PipelineSpec
from .devices import gpu_available
from .sampler import EpochSampler
from .scheduler import StageCost

DEFAULT_H2D_BYTES_PER_S = 12e9


@dataclass(frozen=True)
class Profile:
    costs: tuple[StageCost, ...]
    source_bytes_per_sample: float
    h2d_bytes_per_s: float
    samples: int
    seconds: float  # wall time the profiling took


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def profile(spec: PipelineSpec, batch_size: int, *, batches: int = 3, device: torch.device | None = None) -> Profile:
    started = time.perf_counter()
    gpu = gpu_available() and (device is None or device.type == "cuda")
    if isinstance(spec.source, ImageFiles):
        costs, source_bytes, n = _images(spec, batch_size, batches, gpu)
    else:
        costs, source_bytes, n = _features(spec, batch_size, batches, gpu)
    h2d = measure_h2d() if gpu else DEFAULT_H2D_BYTES_PER_S
    return Profile(tuple(costs), source_bytes, h2d, n, time.perf_counter() - started)


def _first_plans(num_samples: int, batch_size: int, batches: int):
    size = min(batch_size, num_samples)
    sampler = EpochSampler(num_samples, size, shuffle=True, seed=12345)
    return sampler.epoch(0)[:batches]


def _images(spec: PipelineSpec, batch_size: int, batches: int, gpu: bool):
    from .image_runner import ImageRunner

    runner = ImageRunner(spec, spec.all_cpu, torch.device("cpu"), batch_size=min(batch_size, len(spec.source)),
                         seed=0, num_threads=1, prefetch=1)
    plans = _first_plans(len(spec.source), batch_size, batches + 1)
    warm, timed = plans[:1], plans[1:]
    list(runner.batches(iter(warm)))
    runner.stage_seconds = {"host": 0.0, "resize": 0.0, "normalize": 0.0}
    cpu0, thread0 = _process_cpu(), time.thread_time()
    delivered = list(runner.batches(iter(timed)))
    dali_cpu = max((_process_cpu() - cpu0) - (time.thread_time() - thread0), 0.0)
    n = sum(len(b["index"]) for b, _ in delivered if b is not None)
    seconds = runner.stage_seconds
    host_stage = spec.stages[0].name
    encoded = float(np.mean([os.path.getsize(runner.files.paths[i]) for p in timed for i in p.indices]))
    decoded = float(np.mean(runner._sizes[runner._sizes[:, 0] > 0].prod(axis=1))) * 3
    side = runner.size[0] * runner.size[1] * 3
    out_bytes = side * (1 if runner.finish.output is ImageOutput.UINT8_NHWC else 4)
    cpu = {host_stage: seconds["host"] / n, "decode": dali_cpu / n, "resize": seconds["resize"] / n,
           "normalize": seconds["normalize"] / n}
    out = {host_stage: encoded, "decode": decoded, "resize": float(side), "normalize": float(out_bytes)}
    gpu_costs = _image_gpu_costs(spec, batch_size, batches, cpu) if gpu else {}
    runner.close()
    costs = [StageCost(s.name, cpu[s.name], gpu_costs.get(s.name), out[s.name]) for s in spec.stages]
    return costs, encoded, n


def _image_gpu_costs(spec: PipelineSpec, batch_size: int, batches: int, cpu: dict[str, float]) -> dict[str, float]:
    """GPU seconds per sample of the GPU-capable stages: the earliest GPU cut timed end to end with the
    device synchronised, shared among its stages in proportion to their CPU costs."""
    from .image_runner import ImageRunner

    cut = min(spec.valid_cuts())
    device = torch.device("cuda")
    runner = ImageRunner(spec, cut, device, batch_size=min(batch_size, len(spec.source)), seed=0, num_threads=1,
                         prefetch=1)
    plans = _first_plans(len(spec.source), batch_size, batches + 1)
    list(runner.batches(iter(plans[:1])))
    torch.cuda.synchronize()
    started = time.perf_counter()
    n = sum(len(b["index"]) for b, _ in runner.batches(iter(plans[1:])) if b is not None)
    torch.cuda.synchronize()
    per_sample = (time.perf_counter() - started) / max(n, 1)
    runner.close()
    on_gpu = [s.name for s in spec.stages[cut:]]
    total = sum(cpu[name] for name in on_gpu) or 1.0
    return {name: per_sample * cpu[name] / total for name in on_gpu}


def _features(spec: PipelineSpec, batch_size: int, batches: int, gpu: bool):
    from .feature_runner import FeatureRunner

    runner = FeatureRunner(spec, spec.all_cpu, torch.device("cpu"), prefetch=1, num_threads=1)
    plans = _first_plans(runner.num_samples, batch_size, batches)
    seconds = {s.name: 0.0 for s in spec.stages}
    out_bytes = {s.name: 0.0 for s in spec.stages}
    n = 0
    gpu_seconds: dict[str, float] = {}
    for plan in plans:
        data = {"indices": plan.indices}
        for stage, (run, params) in zip(spec.stages, runner._cpu_stages):
            started = time.thread_time()
            produced = run(data, params, np)
            seconds[stage.name] += time.thread_time() - started
            out_bytes[stage.name] += _nbytes(produced)
            data.update(produced)
        n += plan.indices.size
        if gpu:
            _feature_gpu_seconds(spec, runner, data, plan, gpu_seconds)
    source_bytes = float(getattr(runner.reader, "bytes_per_row", 0.0) or out_bytes[spec.stages[0].name] / n)
    costs = [StageCost(s.name, seconds[s.name] / n,
                       (gpu_seconds[s.name] / n) if s.name in gpu_seconds else None, out_bytes[s.name] / n)
             for s in spec.stages]
    runner.close()
    return costs, source_bytes, n


def _feature_gpu_seconds(spec, runner, host_data: dict, plan, into: dict[str, float]) -> None:
    import cupy

    data = {k: (cupy.asarray(v) if isinstance(v, np.ndarray) else v) for k, v in host_data.items()}
    for stage, (run, params) in zip(spec.stages[1:], runner._cpu_stages[1:]):  # the same code runs on CuPy
        cupy.cuda.get_current_stream().synchronize()
        started = time.perf_counter()
        data.update(run(data, params, cupy))
        cupy.cuda.get_current_stream().synchronize()
        into[stage.name] = into.get(stage.name, 0.0) + time.perf_counter() - started


def _nbytes(value) -> float:
    if isinstance(value, dict):
        return float(sum(_nbytes(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return float(sum(_nbytes(v) for v in value))
    return float(getattr(value, "nbytes", 0))


def measure_h2d(size: int = 64 * 2 ** 20, repeats: int = 5) -> float:
    """Host-to-device bandwidth from pinned memory, bytes/s."""
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return size * repeats / (time.perf_counter() - started)
