"""A short profiling run: what each stage costs on each backend, what it outputs, and what the source reads.

Costs are measured through the runners' own profiling hook, on one thread, over a few batches of the
dataset's first samples in a fixed shuffled order, outside any epoch, so profiling never consumes or reorders
what the trainer is given. GPU costs are measured only where a GPU is.
"""
from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ...pipelines.spec import PipelineSpec
from ..runners.contract import Runner, RunnerConfig, StageTimes
from ..sampler import BatchPlan
from .measurements import DEFAULT_H2D_BYTES_PER_S, StageCost

PROBE_SEED = 12345  # the fixed shuffled order of profiling and probes, apart from any epoch the trainer sees

RunnerFactory = Callable[[RunnerConfig], Runner]
# (batch size, seed) -> the order of the Loader's source for one rank: EpochSampler or StreamOrder
OrderFactory = Callable[[int, int], object]


@dataclass(frozen=True)
class Profile:
    costs: tuple[StageCost, ...]
    source_bytes_per_sample: float
    h2d_bytes_per_s: float
    samples: int
    seconds: float  # wall time the profiling took


def first_plans(orders: OrderFactory, batch_size: int, batches: int) -> list[BatchPlan]:
    """The first plans of fixed shuffled epochs, in the source's own order (for a streamed table: one
    buffer-full's chunks, not rows from all over the files). A dataset smaller than ``batches`` batches is
    gone through again, epoch after epoch, so that even one sample gives ``batches`` plans."""
    order = orders(batch_size, PROBE_SEED)
    plans = itertools.islice((plan for epoch in itertools.count() for plan in order.epoch(epoch)), batches)
    # each plan on its own (no epoch size on the rank): given a rank's plans that stop inside its epoch, the image
    # runner pads the epoch out to its planned size, and the padding would count as samples made
    return [dataclasses.replace(plan, shard=None) for plan in plans]


def profile(spec: PipelineSpec, config: RunnerConfig, runners: RunnerFactory, orders: OrderFactory, *,
            gpu: bool, batches: int = 3) -> Profile:
    """``config``: the Loader's placement settings (its batch size and device); ``runners`` makes a runner
    for a config, ``orders`` the source's order. The CPU costs come from the all-CPU placement on one thread,
    the GPU costs from the earliest GPU cut."""
    started = time.perf_counter()
    plans = first_plans(orders, config.batch_size, batches + 1)
    batch_size = max(p.indices.size for p in plans)
    cpu = _measure(runners, dataclasses.replace(config, cut=spec.all_cpu, device=torch.device("cpu"),
                                                 batch_size=batch_size, seed=0, num_threads=1, prefetch=1), plans)
    gpu_seconds: dict[str, float] = {}
    if gpu:
        cut = min(spec.valid_cuts())
        on_gpu = _measure(runners, dataclasses.replace(config, cut=cut, device=torch.device("cuda"),
                                                        batch_size=batch_size, seed=0, num_threads=1, prefetch=1),
                          plans)
        gpu_names = {s.name for s in spec.stages[cut:]}
        gpu_seconds = {k: v / on_gpu.samples for k, v in on_gpu.seconds.items() if k in gpu_names}
        for group, seconds in on_gpu.together.items():
            share = {name: cpu.seconds.get(name, 0.0) for name in group}
            total = sum(share.values()) or 1.0
            gpu_seconds.update({name: seconds / on_gpu.samples * share[name] / total for name in group})
    costs = tuple(StageCost(s.name, cpu.seconds.get(s.name, 0.0) / cpu.samples, gpu_seconds.get(s.name),
                            cpu.bytes_out.get(s.name, 0.0)) for s in spec.stages)
    h2d = measure_h2d() if gpu else DEFAULT_H2D_BYTES_PER_S
    return Profile(costs, cpu.source_bytes_per_sample, h2d, cpu.samples, time.perf_counter() - started)


def _measure(runners: RunnerFactory, config: RunnerConfig, plans: list[BatchPlan]) -> StageTimes:
    """The runner's profile of ``plans[1:]`` after a warm-up batch (``plans[0]``)."""
    runner = runners(config)
    try:
        runner.profile(plans[:1])
        return runner.profile(plans[1:])
    finally:
        runner.close()


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
