"""A short profiling run: what each stage costs on each backend, what it outputs, and what the source reads,
and what each batch costs beyond its samples' stages.

Costs are measured through the runners' own profiling hook, on one thread, over a few batches of the
dataset's first samples in a fixed shuffled order, outside any epoch, so profiling never consumes or reorders
what the trainer is given. GPU costs are measured only where a GPU is. Then as many batches of the next samples
are made through the runner's own batch path (as the Loader's batch thread runs it): its process CPU time
beyond the stages' is the forming cost per batch, and this thread's CPU time the batch thread's own share.
"""
from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ...pipelines.spec import PipelineSpec
from ..cpu_time import process_cpu
from ..runners.contract import Runner, RunnerConfig, StageTimes
from ..sampler import BatchPlan
from .measurements import DEFAULT_H2D_BYTES_PER_S, BatchCosts, StageCost

PROBE_SEED = 12345  # the fixed shuffled order of profiling and probes, apart from any epoch the trainer sees
WARMUP = 1         # batches made before any is timed

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
    batch_costs: BatchCosts = BatchCosts()


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
            gpu: bool, batches: int = 3, delivery_s: float = 0.0) -> Profile:
    """``config``: the Loader's placement settings (its batch size and device); ``runners`` makes a runner
    for a config, ``orders`` the source's order. The CPU costs come from the all-CPU placement on one thread,
    the GPU costs from the earliest GPU cut. ``delivery_s``: the hand-off of a batch to the trainer's thread,
    measured by the caller (the Loader's own hand-off lives above this package)."""
    started = time.perf_counter()
    # A streamed table reads a shuffle buffer-full's chunks as it opens it, for all the buffer's batches: its batch
    # path goes over two whole buffer-fulls, from the first buffer opened after the profiled plans.
    per_buffer = buffer_batches(orders, config.batch_size)
    split = None
    if per_buffer > 1:
        path_from = -(-(WARMUP + batches) // per_buffer) * per_buffer
        split = (WARMUP + batches, path_from)
    # (any other order's: as many plans after the profiled ones, and one more, made first and not counted)
    plans = first_plans(orders, config.batch_size, 2 * batches + 2 if split is None else split[1] + 2 * per_buffer)
    batch_size = max(p.indices.size for p in plans)
    cpu, path = _measure(runners, dataclasses.replace(config, cut=spec.all_cpu, device=torch.device("cpu"),
                                                       batch_size=batch_size, seed=0, num_threads=1, prefetch=1),
                         plans, split=split)
    gpu_seconds: dict[str, float] = {}
    if gpu:
        cut = min(spec.valid_cuts())
        on_gpu, _ = _measure(runners, dataclasses.replace(config, cut=cut, device=torch.device("cuda"),
                                                           batch_size=batch_size, seed=0, num_threads=1,
                                                           prefetch=1), plans, batch_path=False, split=split)
        gpu_names = {s.name for s in spec.stages[cut:]}
        gpu_seconds = {k: max(v, 0.0) / on_gpu.samples for k, v in on_gpu.seconds.items() if k in gpu_names}
        for group, seconds in on_gpu.together.items():
            share = {name: max(cpu.seconds.get(name, 0.0), 0.0) for name in group}
            total = sum(share.values()) or 1.0
            gpu_seconds.update({name: seconds / on_gpu.samples * share[name] / total for name in group})
    # Clocks read in pieces (a share of a folded stage's time taken off another's, busy time beside thread
    # time) can leave a stage a hair below zero: nothing costs less than nothing.
    ran = {s.name: max(cpu.seconds.get(s.name, 0.0), 0.0) for s in spec.stages}
    blocked = {s.name: max(cpu.blocked.get(s.name, 0.0), 0.0) for s in spec.stages}
    costs = tuple(StageCost(s.name, (ran[s.name] + blocked[s.name]) / cpu.samples, gpu_seconds.get(s.name),
                            cpu.bytes_out.get(s.name, 0.0), blocked[s.name] / cpu.samples)
                  for s in spec.stages)
    h2d, latency = measure_h2d() if gpu else (DEFAULT_H2D_BYTES_PER_S, 0.0)
    batch_costs = batch_costs_of(costs, path, delivery_s=delivery_s, transfer_s=latency * path.tensors)
    return Profile(costs, cpu.source_bytes_per_sample, h2d, cpu.samples, time.perf_counter() - started,
                   batch_costs)


def buffer_batches(orders: OrderFactory, batch_size: int) -> int:
    """Batches per shuffle buffer-full of a streamed table's order (1 for an order without one), no more than
    its epoch's (a buffer larger than the table holds the whole table: with the default 65,536 rows, a 3,000-row
    table profiled 512 batches a buffer-full, the file over and over). A gzip file still being indexed counts
    its epoch's estimated batches (``len``), without waiting for the index."""
    order = orders(batch_size, PROBE_SEED)
    rows = getattr(order, "buffer_rows", None)
    if not isinstance(rows, int):
        return 1
    return max(1, min(-(-rows // batch_size), len(order)))


def median_times(times: list[StageTimes]) -> StageTimes:
    """One ``StageTimes`` of all ``times``' samples whose seconds per sample, per stage, are the median of theirs;
    bytes out per sample are the mean over the samples."""
    samples = sum(t.samples for t in times)

    def median(per_batch: Callable[[StageTimes], dict]) -> dict:
        keys = {k for t in times for k in per_batch(t)}
        return {k: statistics.median(per_batch(t).get(k, 0.0) / max(t.samples, 1) for t in times) * samples
                for k in keys}

    bytes_out = {k: sum(t.bytes_out.get(k, 0.0) * t.samples for t in times) / max(samples, 1)
                 for k in {k for t in times for k in t.bytes_out}}
    source = sum(t.source_bytes_per_sample * t.samples for t in times) / max(samples, 1)
    return StageTimes(samples, median(lambda t: t.seconds), bytes_out, source, median(lambda t: t.together),
                      median(lambda t: t.blocked))


@dataclass(frozen=True)
class BatchPath:
    """The runner's own batch path over some batches, timed on the thread that iterates it: the process's CPU
    seconds, this thread's, and the tensors of a batch."""

    batches: int
    samples: int
    process_cpu_s: float
    thread_cpu_s: float
    tensors: int


def batch_costs_of(costs: tuple[StageCost, ...], path: BatchPath, *, delivery_s: float = 0.0,
                   transfer_s: float = 0.0) -> BatchCosts:
    """Per batch: the process CPU of the batch path beyond its samples' stage core seconds (forming,
    assembling), and the batch thread's own CPU time (its stages included)."""
    if path.batches == 0:
        return BatchCosts(delivery_s=delivery_s, transfer_s=transfer_s)
    staged = path.samples * sum(c.core_s_per_sample or 0.0 for c in costs)
    return BatchCosts(cpu_s=max(0.0, path.process_cpu_s - staged) / path.batches,
                      thread_s=path.thread_cpu_s / path.batches, delivery_s=delivery_s, transfer_s=transfer_s)


def _measure(runners: RunnerFactory, config: RunnerConfig, plans: list[BatchPlan], *,
             batch_path: bool = True, split: tuple[int, int] | None = None) -> tuple[StageTimes, BatchPath | None]:
    """The runner's profile of the first half of the plans after the warm-up ones, batch by batch (each stage's
    median per sample: a one-off cost, such as a kernel loaded at its first call, is no stage's steady cost),
    then (``batch_path``) its batch path over the rest (other samples: what the first made may be cached),
    timed from its first batch made; ``split`` ``(end, start)``: profile the plans before ``end``, the batch path
    from ``start`` on, timed whole (a streamed table's)."""
    runner = runners(config)
    half = WARMUP + (len(plans) - WARMUP) // 2
    end, start = (half, half) if split is None else split
    try:
        runner.profile(plans[:WARMUP])
        times = median_times([runner.profile([plan]) for plan in plans[WARMUP:end]])
        return times, _batch_path(runner, plans[start:], from_first=split is None) if batch_path else None
    finally:
        runner.close()


def _batch_path(runner: Runner, plans: list[BatchPlan], *, from_first: bool = False) -> BatchPath:
    """The runner's batch path over ``plans``, timed on this thread. ``from_first``: from the first batch made to
    the last, that one left out (the path's start and end, a pipeline priming and draining, are no batch's steady
    cost, as the stage profile's medians leave a one-off cost out: image-val's first profile in a process counted
    54 ms a batch of forming over 5 batches, the next ones 2-3); else the whole path (a streamed table's first
    batch reads its first buffer-full's chunks for all its batches: that is the path's cost)."""
    batches = samples = tensors = 0
    cpu0, thread0 = process_cpu(), time.thread_time()
    first, last = not from_first, None
    made = runner.batches(iter(plans))
    try:
        for batch, _ in made:
            if batch is None:
                continue
            tensors = len(batch)
            if not first:  # the first batch made: the clock starts
                first = True
                cpu0, thread0 = process_cpu(), time.thread_time()
                continue
            batches += 1
            samples += len(batch["index"])
            if from_first:
                last = process_cpu(), time.thread_time()
    finally:
        made.close()
    cpu1, thread1 = last if last is not None else (process_cpu(), time.thread_time())
    return BatchPath(batches, samples, cpu1 - cpu0, thread1 - thread0, tensors)


def measure_h2d(size: int = 64 * 2 ** 20, repeats: int = 5) -> tuple[float, float]:
    """Host-to-device bandwidth from pinned memory, bytes/s, and the fixed cost of one small copy, s."""
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    bandwidth = size * repeats / (time.perf_counter() - started)
    small = 64
    started = time.perf_counter()
    for _ in range(repeats * 20):
        dev[:small].copy_(host[:small], non_blocking=True)
    torch.cuda.synchronize()
    return bandwidth, (time.perf_counter() - started) / (repeats * 20)
