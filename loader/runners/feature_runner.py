"""Runs a tabular feature pipeline for one placement: stages before the cut on the CPU in worker threads, one
host-to-device copy per batch at the cut, the rest on the GPU with CuPy, torch tensors out.

A batch is a dict of torch tensors on ``device``:
``label`` float32 [B]; ``dense`` float32 [B, D]; ``index`` int64 [B] (= ``plan.indices``); ``valid`` bool [B]
when the plan holds padding or bad rows; ``sparse`` = ``{"keys", "values" int64, "lengths" int32, "offsets"
int64}`` in TorchRec's key-major layout, so ``KeyedJaggedTensor(**batch["sparse"])`` takes it as is.

Each batch is made in a few whole-batch native passes that release the GIL (``feedline.ops``: gather the rows
from the source's cached chunks, normalise, hash, lay out the keys), written straight into one buffer per
batch (``feature_buffers``): the batch's own tensors on a CPU placement, or a pinned buffer that crosses to the
GPU in one copy (only what the GPU stages need: the raw columns when everything after parsing runs there). The
worker threads run ahead of the batch thread (``plan_threads``).

A streamed table's plans are warmed a shuffle buffer-full ahead: the first batch of a buffer-full needs every
chunk of it, so instead of all threads reading them together when that batch is made (while the trainer
drains the batches queued), each plan of the buffer-full before reads its share of them (``_warm``). The
cache holds two buffer-fulls, the one being gathered and the one being warmed.
"""
from __future__ import annotations

import time
from typing import Any, Iterator

import numpy as np
import torch

from ...ops.batch_rows import batch_rows
from ...ops.gather_columns import touched_chunks
from ...pipelines.spec import PipelineSpec
from ...pipelines.validate import int_in, positive_int
from ..errors import PlacementError, Skipped
from ..sampler import BatchPlan
from ..sources.table_rows import TabularReader
from . import transfer
from .buffers import BufferRing
from .contract import NO_TIMER, BatchInfo, RunnerConfig, StageTimer, StageTimes
from .feature_buffers import BatchArrays
from .folded import Folded
from .plan_threads import PlanThreads

MAX_PREFETCH = 64


class FeatureRunner:
    def __init__(self, spec: PipelineSpec, source: TabularReader, config: RunnerConfig):
        cut = config.cut
        if isinstance(cut, bool) or not isinstance(cut, int) or cut not in spec.valid_cuts():
            raise ValueError(f"cut must be one of pipeline {spec.name!r}'s valid cuts {spec.valid_cuts()}, got {cut!r}")
        self.prefetch = int_in("prefetch", config.prefetch, 1, MAX_PREFETCH)
        self.num_threads = positive_int("num_threads", config.num_threads)
        self.spec = spec
        self.cut = cut
        self.device = config.device
        self.on_gpu = cut < spec.all_cpu
        if self.on_gpu and self.device.type != "cuda":
            raise PlacementError(f"placement {spec.describe_cut(cut)!r} runs {[s.name for s in spec.stages[cut:]]} "
                                 f"on the GPU, so batches must be delivered on a CUDA device, got device={self.device}")
        self.source = source
        self.num_samples = source.num_rows
        self._parse = spec.stages[0]
        self._cpu_stages = spec.stages[:cut]
        self._gpu_stages = spec.stages[cut:]
        assemble = [s for s in spec.stages if "sparse" in s.produces]
        self._keys = tuple(assemble[0].keys) if assemble else ()
        # What crosses to the GPU at the cut: whatever the GPU stages or the outputs need from the CPU stages.
        made_on_cpu = {name for stage in self._cpu_stages for name in stage.produces}
        needed = set(spec.outputs).union(*(stage.consumes for stage in self._gpu_stages))
        self._crossing = tuple(sorted(made_on_cpu & needed))
        # Row-by-row stages folded into reading the table (each chunk prepared once as it is read), if they can be.
        self._folded = Folded.plan(spec, cut, source)
        self._prepared = self._folded.rows_of(source) if self._folded is not None else None
        # The CPU stages run over the rows read (parsing, and the stages folded into reading, done by then)
        self._after_read = self._cpu_stages[1 + (len(self._folded.stages) if self._folded is not None else 0):]
        # Plans in flight: each thread finds its next plan queued when it finishes one.
        depth = max(self.prefetch, self.num_threads) + self.num_threads
        self._threads = PlanThreads(self.num_threads, depth)
        # Plans a buffer-full (half the table's cache: ``Loader`` keeps two) ahead, where that is two plans or more.
        # (A buffer-full holds no more than the table: ahead of that, plans of later epochs would be warmed.)
        window = min(int(getattr(source, "requested_cache_rows", 0)) // 2, int(getattr(source, "num_rows", 0)))
        ahead = window // max(config.batch_size, 1)
        self._warm_ahead = ahead if ahead >= 2 and hasattr(source, "first_row") else 0
        self._warmed = self._prepared if self._prepared is not None else source
        self._ring = BufferRing(depth + self.prefetch + 4) if self.device.type == "cpu" else None
        # What goes into a batch's buffer: the crossing arrays, or (all on the CPU) the outputs.
        self._batch_arrays = BatchArrays(self._cpu_stages, self._crossing if self.on_gpu else tuple(spec.outputs),
                                   assemble[0].alias if assemble else None, self._ring)

    @property
    def skipped(self) -> list[Skipped]:
        """Bad rows met so far with ``on_error="skip"`` (each delivered as an invalid slot), once each."""
        return self.source.skipped

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict[str, Any], BatchInfo]]:
        made = self._threads.run(iter(plans), self._host_part, warm=self._warm if self._warm_ahead else None,
                                 ahead=self._warm_ahead)
        try:
            for plan, host in made:
                yield self._device_part(plan, host), BatchInfo(plan.epoch, plan.start + plan.indices.size, plan.last)
        finally:
            made.close()

    def keep_threads(self) -> None:
        """Keep the worker threads from one run of ``batches`` to the next, until ``close``. For a caller that runs
        the runner once per short group of plans (remote workers, a local share of their groups): new threads
        for every run start with cold scratch arrays and memory, a page fault at every first touch (hundreds
        per batch)."""
        self._threads.keep()

    def _warm(self, plan: BatchPlan, part: int, parts: int) -> None:
        """Share ``part`` of ``parts`` of the chunks ``plan`` reads (those at positions ``part`` modulo ``parts``
        of its chunks in number order), read ahead into the table's cache. The ``parts`` consecutive plans of a
        shuffled buffer-full each read all its chunks, so together they read each once, and each reads as many
        as the others give or take one (shares by chunk number modulo ``parts`` gave one plan 0 chunks and
        another 5); an epoch's last buffer-full may have fewer plans, so its last plan asks for all its chunks."""
        # (the table's count now: a gzip table's index may grow while it is read)
        chunks = touched_chunks(plan.indices, self.source.first_row, self.source.num_rows).tolist()
        self._warmed.warm(chunks if plan.last else chunks[part::parts])

    # ---- the CPU part ---------------------------------------------------------------------------------
    def _cpu_data(self, plan: BatchPlan, out: dict[str, np.ndarray], timer: StageTimer
                  ) -> tuple[dict[str, Any], np.ndarray]:
        """The CPU stages' arrays of ``plan``'s batch, and which of its rows are bad, each stage timed by ``timer``
        (``profile``; a batch made for delivery runs them in ``_host_part``, untimed)."""
        started = timer.start()
        if self._folded is not None:
            data, bad, charged, spent = self._folded.read(self._prepared, plan.indices, out, charge=True)
        else:
            data, bad = self._parse.read(self.source, plan.indices, out)
        took = timer.clock() - started
        if self._folded is not None:  # the gather's own time, and each folded stage's share of preparing
            took += charged.get(self._parse.name, 0.0) - spent
            for stage in self._folded.stages:
                timer.add(stage.name, charged.get(stage.name, 0.0))
        timer.add(self._parse.name, took)
        for stage in self._after_read:
            started = timer.start()
            data.update(stage.run(data, np, out))
            timer.stop(stage.name, started)
        return data, bad

    def _host_part(self, plan: BatchPlan):
        """The CPU stages of ``plan``'s batch, written into its buffer: on the CPU the batch itself (tensors
        viewing the buffer), for a GPU (pinned buffer tensor, unpack layout)."""
        rows = plan.indices.size
        if self._ring is not None:  # a CPU placement: the batch is the buffer's own tensors, made with it once
            dressed, placed = self._batch_arrays.dressed(rows)  # (``placed``, held by ``out``: the buffer stays taken)
            out = self._batch_arrays.arrays(rows, dressed.array, placed)
        else:
            layout, _ = self._batch_arrays.layout(rows)
            tensor, buffer = self._batch_arrays.buffer(layout.nbytes)
            out = self._batch_arrays.arrays(rows, buffer)
        # The CPU stages, untimed (``_cpu_data`` times them): no timer called, no charges looked at.
        if self._folded is not None:
            data, bad, _, _ = self._folded.read(self._prepared, plan.indices, out)
        else:
            data, bad = self._parse.read(self.source, plan.indices, out)
        for stage in self._after_read:
            data.update(stage.run(data, np, out))
        # The rows and their validity written in one GIL-free pass that counts the valid ones (no look at the masks
        # holding the GIL: a mask's argmax after the kernels' passes took ~7 us a batch, cold in the cache)
        all_valid = batch_rows(plan.indices, plan.valid, bad, out["index"], out["valid"]) == rows
        if self._ring is not None:  # each tensor keeps the ring's buffer taken while the trainer holds it
            return self._batch_arrays.delivered(data, self.spec.outputs, dressed, rows, not all_valid)
        moving = {name: data[name] for name in self._crossing} if self.on_gpu else \
            transfer.plain(data, self.spec.outputs)
        moving["index"] = out["index"]
        if not all_valid:  # padding, bad rows skipped in their places
            moving["valid"] = out["valid"]
        if not self.on_gpu:  # the shared outputs are on the device already
            for name in self._batch_arrays.constants(rows):
                group, _, key = name.partition(".")
                del moving[group][key]
        where = transfer.layout_in(buffer, moving)
        if where is None:  # something of unknown size (list columns, multi-hot keys): packed again, once
            return self._batch_arrays.pack(moving)
        if "valid" not in moving:  # (its place is last): the copy stops before it
            tensor = tensor[:layout.places["valid"][0]]
        return tensor, where

    # ---- the device part ------------------------------------------------------------------------------
    def _device_part(self, plan: BatchPlan, host) -> dict[str, Any]:
        if self.device.type == "cpu":
            batch = host
        elif not self.on_gpu:
            tensor, layout = host
            batch = transfer.unpack(tensor.to(self.device, non_blocking=True), layout, transfer.torch_view)
            for name, shared in self._batch_arrays.on_device(plan.indices.size, self.device).items():
                group, _, key = name.partition(".")
                batch[group][key] = shared
        else:
            batch = self._run_gpu(host)
        if "sparse" in batch:
            batch["sparse"] = {"keys": list(self._keys), **batch["sparse"]}
        return batch

    def _run_gpu(self, host, timer: StageTimer = NO_TIMER) -> dict[str, Any]:
        import cupy

        tensor, layout = host
        with cupy.cuda.Device(self.device.index or 0), \
                cupy.cuda.ExternalStream(torch.cuda.current_stream(self.device).cuda_stream) as stream:
            on_device = tensor.to(self.device, non_blocking=True)
            data = transfer.unpack(cupy.asarray(on_device), layout, transfer.cupy_view)
            out = self.run_stages(data, cupy, stream, timer)
            return transfer.convert(out, torch.from_dlpack)

    def run_stages(self, data: dict[str, Any], xp, stream=None, timer: StageTimer = NO_TIMER) -> dict:
        """The GPU stages over ``data`` (the arrays that crossed, as ``xp`` arrays): the outputs, ``index`` and
        ``valid``. ``stream``: synchronised around each stage when ``timer`` times (a wall clock's)."""
        for stage in self._gpu_stages:
            if timer.timing:
                stream.synchronize()
            started = timer.start()
            data.update(stage.run(data, xp))
            if timer.timing:
                stream.synchronize()
            timer.stop(stage.name, started)
        out = transfer.plain(data, self.spec.outputs)
        out.update({name: data[name] for name in ("index", "valid") if name in data})
        return out

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """Each CPU stage's thread time and each GPU stage's synchronised time, on this thread, batch by batch."""
        cpu = StageTimer()
        gpu = StageTimer(time.perf_counter)
        gpu.seconds = seconds = cpu.seconds  # (stage names are distinct: one dict of seconds)
        out_bytes: dict[str, float] = {}
        samples = 0
        for plan in plans:
            rows = plan.indices.size
            data, _ = self._cpu_data(plan, self._batch_arrays.arrays(rows, None), cpu)
            shapes = self._batch_arrays.layout(rows)[1]
            for stage in self._cpu_stages:  # (arrays a folded stage never makes whole: the size they would have)
                out_bytes[stage.name] = out_bytes.get(stage.name, 0.0) + sum(
                    _nbytes(data[k]) if k in data else _declared_nbytes(shapes, k) for k in stage.produces)
            if self.on_gpu:
                self._run_gpu(self._batch_arrays.pack({name: data[name] for name in self._crossing}), gpu)
            samples += rows
        per_sample = {k: v / samples for k, v in out_bytes.items()}
        first = self.spec.stages[0].name
        source_bytes = float(getattr(self.source, "bytes_per_row", 0.0) or per_sample.get(first, 0.0))
        return StageTimes(samples, seconds, per_sample, source_bytes)

    def close(self) -> None:
        self._threads.close()


def _declared_nbytes(shapes: dict, name: str) -> float:
    if name not in shapes:
        return 0.0
    shape, dtype = shapes[name]
    return float(np.prod(shape, dtype=np.int64) * np.dtype(dtype).itemsize)


def _nbytes(value) -> float:
    if isinstance(value, dict):
        return float(sum(_nbytes(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return float(sum(_nbytes(v) for v in value))
    return float(getattr(value, "nbytes", 0))

