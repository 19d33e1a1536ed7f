"""Runs a tabular feature pipeline for one placement: stages before the cut on the CPU with NumPy in worker
threads, one host-to-device copy per batch at the cut, the rest on the GPU with CuPy, torch tensors out.

A batch is a dict of torch tensors on ``device``:
``label`` float32 [B]; ``dense`` float32 [B, D]; ``index`` int64 [B] (= ``plan.indices``); ``valid`` bool [B]
when the plan holds padding; ``sparse`` = ``{"keys", "values" int64, "lengths" int32, "offsets" int64}`` in
TorchRec's key-major layout, so ``KeyedJaggedTensor(**batch["sparse"])`` takes it as is.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np
import torch

from ...pipelines.spec import PipelineSpec
from ..errors import PlacementError, Skipped
from ..sampler import BatchPlan
from ..sources.tabular import TabularReader
from . import transfer
from .contract import BatchInfo, RunnerConfig, StageTimes

MAX_PREFETCH = 64
_THREAD_PREFIX = "feedline-features"


def _may_join() -> bool:
    """Whether this thread may wait for a pool's workers. A stream dropped in a reference cycle is closed by
    the garbage collector on whatever thread runs it: one of the pool's own (which cannot join itself), or a
    thread still starting inside the threading module (seen as a dummy thread; joining there deadlocks on
    the module's own lock). Those leave the workers to finish on their own."""
    current = threading.current_thread()
    return not isinstance(current, threading._DummyThread) and not current.name.startswith(_THREAD_PREFIX)


class FeatureRunner:
    def __init__(self, spec: PipelineSpec, source: TabularReader, config: RunnerConfig):
        cut = config.cut
        if isinstance(cut, bool) or not isinstance(cut, int) or cut not in spec.valid_cuts():
            raise ValueError(f"cut must be one of pipeline {spec.name!r}'s valid cuts {spec.valid_cuts()}, got {cut!r}")
        if isinstance(config.prefetch, bool) or not isinstance(config.prefetch, int) \
                or not 1 <= config.prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be an integer in [1, {MAX_PREFETCH}], got {config.prefetch!r}")
        if isinstance(config.num_threads, bool) or not isinstance(config.num_threads, int) or config.num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer, got {config.num_threads!r}")
        self.spec = spec
        self.cut = cut
        self.device = config.device
        self.on_gpu = cut < spec.all_cpu
        if self.on_gpu and self.device.type != "cuda":
            raise PlacementError(f"placement {spec.describe_cut(cut)!r} runs {[s.name for s in spec.stages[cut:]]} "
                                 f"on the GPU, so batches must be delivered on a CUDA device, got device={self.device}")
        self.prefetch = config.prefetch
        self.num_threads = config.num_threads
        self.source = source
        self.num_samples = source.num_rows
        self._cpu_stages = spec.stages[:cut]
        self._gpu_stages = spec.stages[cut:]
        assemble = [s for s in spec.stages if "sparse" in s.produces]
        self._keys = tuple(assemble[0].keys) if assemble else ()
        # What crosses to the GPU at the cut: whatever the GPU stages or the outputs need from the CPU stages.
        made_on_cpu = {name for stage in self._cpu_stages for name in stage.produces}
        needed = set(spec.outputs).union(*(stage.consumes for stage in self._gpu_stages))
        self._crossing = tuple(sorted(made_on_cpu & needed))

    @property
    def skipped(self) -> list[Skipped]:
        """Bad rows left out when the files were opened with ``on_error="skip"``."""
        return self.source.skipped

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict[str, Any], BatchInfo]]:
        plans = iter(plans)
        depth = max(self.prefetch, self.num_threads)
        pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=_THREAD_PREFIX)
        pending: deque = deque()
        try:
            while True:
                while len(pending) < depth:
                    plan = next(plans, None)
                    if plan is None:
                        break
                    pending.append((plan, pool.submit(self._host_part, plan)))
                if not pending:
                    return
                plan, future = pending.popleft()
                try:
                    host = future.result()
                except BaseException as e:
                    if hasattr(e, "add_note"):
                        rows = plan.indices
                        e.add_note(f"raised in a feedline feature worker thread preparing a batch of {rows.size} "
                                   f"rows (first {rows[:4].tolist()})")
                    raise
                yield self._device_part(plan, host), BatchInfo(plan.epoch, plan.start + plan.indices.size, plan.last)
        finally:
            for _, future in pending:
                future.cancel()
            pool.shutdown(wait=_may_join(), cancel_futures=True)

    def _cpu_data(self, plan: BatchPlan, timed: dict[str, float] | None = None) -> dict[str, Any]:
        started = time.thread_time() if timed is not None else 0.0
        rows = self.source.read(plan.indices)
        data: dict[str, Any] = {"columns": rows.columns, "valid": plan.valid & ~rows.bad}
        if timed is not None:  # reading the rows is the parse stage's work
            first = self.spec.stages[0].name
            timed[first] = timed.get(first, 0.0) + time.thread_time() - started
        for stage in self._cpu_stages:
            started = time.thread_time() if timed is not None else 0.0
            data.update(stage.run(data, np))
            if timed is not None:
                timed[stage.name] = timed.get(stage.name, 0.0) + time.thread_time() - started
        return data

    def _host_part(self, plan: BatchPlan):
        data = self._cpu_data(plan)
        moving = {name: data[name] for name in self._crossing} if self.on_gpu else transfer.plain(data, self.spec.outputs)
        moving["index"] = np.asarray(plan.indices, dtype=np.int64)
        if not data["valid"].all():  # padding, and bad rows skipped in their places
            moving["valid"] = np.asarray(data["valid"], dtype=bool)
        return moving if self.device.type == "cpu" else transfer.pack(moving)

    def _device_part(self, plan: BatchPlan, host) -> dict[str, Any]:
        if self.device.type == "cpu":
            batch = transfer.convert(host, torch.from_numpy)
        elif not self.on_gpu:
            batch = transfer.unpack(torch.from_numpy(host[0]).to(self.device), host[1], transfer.torch_view)
        else:
            batch = self._run_gpu(host)
        if "sparse" in batch:
            batch["sparse"] = {"keys": list(self._keys), **batch["sparse"]}
        return batch

    def _run_gpu(self, host, timed: dict[str, float] | None = None) -> dict[str, Any]:
        import cupy

        with cupy.cuda.Device(self.device.index or 0), \
                cupy.cuda.ExternalStream(torch.cuda.current_stream(self.device).cuda_stream) as stream:
            data = transfer.unpack(cupy.asarray(host[0]), host[1], transfer.cupy_view)
            for stage in self._gpu_stages:
                if timed is not None:
                    stream.synchronize()
                    started = time.perf_counter()
                data.update(stage.run(data, cupy))
                if timed is not None:
                    stream.synchronize()
                    timed[stage.name] = timed.get(stage.name, 0.0) + time.perf_counter() - started
            out = transfer.plain(data, self.spec.outputs)
            out.update({name: data[name] for name in ("index", "valid") if name in data})
            return transfer.convert(out, torch.from_dlpack)

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """Each CPU stage's thread time and each GPU stage's synchronised time, on this thread, batch by batch."""
        seconds: dict[str, float] = {}
        out_bytes: dict[str, float] = {}
        samples = 0
        for plan in plans:
            data = self._cpu_data(plan, seconds)
            for stage in self._cpu_stages:
                out_bytes[stage.name] = out_bytes.get(stage.name, 0.0) + _nbytes({k: data[k] for k in stage.produces})
            if self.on_gpu:
                self._run_gpu(transfer.pack({name: data[name] for name in self._crossing}), seconds)
            samples += plan.indices.size
        per_sample = {k: v / samples for k, v in out_bytes.items()}
        first = self.spec.stages[0].name
        source_bytes = float(getattr(self.source, "bytes_per_row", 0.0) or per_sample.get(first, 0.0))
        return StageTimes(samples, seconds, per_sample, source_bytes)

    def close(self) -> None:
        pass


def _nbytes(value) -> float:
    if isinstance(value, dict):
        return float(sum(_nbytes(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return float(sum(_nbytes(v) for v in value))
    return float(getattr(value, "nbytes", 0))
