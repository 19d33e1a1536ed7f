"""Runs a tabular feature pipeline for one placement: stages before the cut on the CPU in worker threads, one
host-to-device copy per batch at the cut, the rest on the GPU with CuPy, torch tensors out.

A batch is a dict of torch tensors on ``device``:
``label`` float32 [B]; ``dense`` float32 [B, D]; ``index`` int64 [B] (= ``plan.indices``); ``valid`` bool [B]
when the plan holds padding; ``sparse`` = ``{"keys", "values" int64, "lengths" int32, "offsets" int64}`` in
TorchRec's key-major layout, so ``KeyedJaggedTensor(**batch["sparse"])`` takes it as is.

Each batch is made in a few whole-batch native passes that release the GIL (``feedline.ops``: gather the rows
from the source's cached chunks, normalise, hash, lay out the keys), written straight into one buffer per
batch: the batch's own tensors on a CPU placement (reused once the trainer lets go of them), or a pinned
buffer that crosses to the GPU in one copy (only what the GPU stages need: the raw columns when everything
after parsing runs there). Intermediate arrays are scratch reused by each thread.
"""
from __future__ import annotations

import os
import select
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Iterator

import numpy as np
import torch

from ...pipelines.spec import PipelineSpec
from ..errors import PlacementError, Skipped
from ..sampler import BatchPlan
from ..sources.table_rows import TabularReader
from . import transfer
from .buffers import BufferRing
from .contract import BatchInfo, RunnerConfig, StageTimes
from .folded import Folded

MAX_PREFETCH = 64
_THREAD_PREFIX = "feedline-features"


def _may_join() -> bool:
    """Whether this thread may wait for a pool's workers. A stream dropped in a reference cycle is closed by
    the garbage collector on whatever thread runs it: one of the pool's own (which cannot join itself), or a
    thread still starting inside the threading module (seen as a dummy thread; joining there deadlocks on
    the module's own lock). Those leave the workers to finish on their own."""
    current = threading.current_thread()
    return not isinstance(current, threading._DummyThread) and not current.name.startswith(_THREAD_PREFIX)


class _Doorbell:
    """How a worker tells the batch thread that the batch it waits for is done: a byte through a pipe, and only
    while it waits for that very batch (``watch``), so that batches finished ahead of time wake nobody.
    Writing and waiting are system calls made without the GIL, where a ``Condition`` (a ``Future``'s
    ``result()``) wakes the waiting thread from inside a call that holds it: on a virtual machine, where waking a
    thread on another core is slow, the GIL then stays held for the whole wake-up, once per batch. A ring that
    finds the pipe full is not needed: a wake-up is already pending."""

    def __init__(self):
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._closed = False
        self._watched = None

    def ring(self, future=None) -> None:
        if future is not None and future is not self._watched:
            return
        try:
            os.write(self._write, b"\0")
        except (BlockingIOError, OSError):  # full (a wake-up is pending), or closed with the stream
            pass

    def wait_for(self, future) -> None:
        """Until ``future`` is done (its callback rings the bell once it is watched; a ring may be spurious)."""
        self._watched = future  # set before looking: a worker finishing now then sees it and rings
        while not future.done():
            select.select([self._read], [], [])
            os.read(self._read, 4096)
        self._watched = None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._read)
            os.close(self._write)


class _Layout:
    """Where each array a batch of ``rows`` rows is written to lies in its one buffer: ``places[name]`` =
    (offset, shape, dtype), 16-byte aligned; ``nbytes`` in all."""

    def __init__(self, arrays: dict[str, tuple[tuple[int, ...], np.dtype]]):
        self.places: dict[str, tuple[int, int, tuple[int, ...], np.dtype]] = {}
        offset = 0
        for name, (shape, dtype) in arrays.items():
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self.places[name] = (offset, offset + nbytes, shape, np.dtype(dtype))
            offset += transfer.aligned(nbytes)
        self.nbytes = max(offset, transfer.ALIGN)

    def views(self, buffer: np.ndarray) -> dict[str, np.ndarray]:
        return {name: buffer[a:b].view(d).reshape(s) for name, (a, b, s, d) in self.places.items()}


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
        self._parse = spec.stages[0]
        self._cpu_stages = spec.stages[:cut]
        self._gpu_stages = spec.stages[cut:]
        assemble = [s for s in spec.stages if "sparse" in s.produces]
        self._assemble = assemble[0] if assemble else None
        self._keys = tuple(self._assemble.keys) if assemble else ()
        # What crosses to the GPU at the cut: whatever the GPU stages or the outputs need from the CPU stages.
        made_on_cpu = {name for stage in self._cpu_stages for name in stage.produces}
        needed = set(spec.outputs).union(*(stage.consumes for stage in self._gpu_stages))
        self._crossing = tuple(sorted(made_on_cpu & needed))
        # What goes into a batch's buffer: the crossing arrays, or (all on the CPU) the outputs.
        self._delivered = self._crossing if self.on_gpu else tuple(spec.outputs)
        # Row-by-row stages folded into reading the table (each chunk prepared once as it is read), if they can be.
        self._folded = Folded.plan(spec, cut, source)
        self._prepared = self._folded.rows_of(source) if self._folded is not None else None
        self._layouts: dict[int, tuple[_Layout, dict]] = {}
        # Outputs every batch of a size shares (the sparse lengths and offsets of one id per key and row), made
        # once per size, as TorchRec's own loader shares them: they are never written per batch.
        self._shared: dict[int, dict[str, np.ndarray]] = {}
        self._device_shared: dict[int, dict[str, torch.Tensor]] = {}
        self._scratch = threading.local()
        # Plans in flight: each thread finds its next plan queued when it finishes one, so it need not be woken
        # (a wake-up is a system call made holding the GIL, and costly on virtual machines).
        self._depth = max(self.prefetch, self.num_threads) + self.num_threads
        self._ring = BufferRing(self._depth + self.prefetch + 4) if self.device.type == "cpu" else None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def skipped(self) -> list[Skipped]:
        """Bad rows left out when the files were opened with ``on_error="skip"``."""
        return self.source.skipped

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict[str, Any], BatchInfo]]:
        plans = iter(plans)
        depth = self._depth
        pool = self._pool or ThreadPoolExecutor(self.num_threads, thread_name_prefix=_THREAD_PREFIX)
        pending: deque = deque()
        done = _Doorbell()
        try:
            while True:
                while len(pending) < depth:
                    plan = next(plans, None)
                    if plan is None:
                        break
                    future = pool.submit(self._host_part, plan)
                    future.add_done_callback(done.ring)
                    pending.append((plan, future))
                if not pending:
                    return
                plan, future = pending.popleft()
                done.wait_for(future)
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
            if pool is not self._pool:
                pool.shutdown(wait=_may_join(), cancel_futures=True)
            elif _may_join():  # kept threads: the work already running ends with the stream
                wait([future for _, future in pending])
            done.close()

    def keep_threads(self) -> None:
        """Keep the worker threads from one run of ``batches`` to the next, until ``close``. For a caller that runs
        the runner once per short group of plans (remote workers, a local share of their groups): new threads
        for every run start with cold scratch arrays and memory, a page fault at every first touch (hundreds
        per batch)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix=_THREAD_PREFIX)

    # ---- the CPU part ---------------------------------------------------------------------------------
    def _constants(self, rows: int) -> dict[str, np.ndarray]:
        """The CPU stages' outputs that every batch of ``rows`` rows shares (``FeatureStage.constants``)."""
        constants = self._shared.get(rows)
        if constants is None:
            constants = {}
            for stage in self._cpu_stages:
                constants.update(stage.constants(rows))
            self._shared[rows] = constants
        return constants

    def _layout(self, rows: int) -> tuple[_Layout, dict[str, tuple]]:
        """The buffer layout of a batch of ``rows``, and the fixed shapes of every array the CPU stages make."""
        if rows not in self._layouts:
            shapes: dict[str, tuple] = {}
            for stage in self._cpu_stages:
                shapes.update(stage.shapes(rows))
            constants = self._constants(rows)
            placed = {}
            for name in self._delivered:
                for key in (name, f"{name}.values", f"{name}.lengths", f"{name}.offsets"):
                    if key in shapes and key not in constants:
                        placed[key] = shapes[key]
            placed["index"] = ((rows,), np.dtype(np.int64))
            placed["valid"] = ((rows,), np.dtype(np.bool_))
            self._layouts[rows] = (_Layout(placed), shapes)
        return self._layouts[rows]

    def _arrays(self, rows: int, buffer: np.ndarray | None) -> dict[str, np.ndarray]:
        """The arrays the CPU stages write a batch into: views of ``buffer`` for what it carries, this thread's
        scratch for the rest, and, where the sparse values are in the buffer and one input is all of them, that
        input as a view of them."""
        layout, shapes = self._layout(rows)
        placed = layout.views(buffer) if buffer is not None else {}
        scratch = self._scratch.__dict__
        constants = self._constants(rows)
        arrays = {"constant": bool(constants)}
        for name, (shape, dtype) in shapes.items():
            if name in constants:
                arrays[name] = constants[name]
                continue
            if name in placed:
                arrays[name] = placed[name]
                continue
            key = (name, shape, dtype)
            if key not in scratch:
                scratch[key] = np.empty(shape, dtype=dtype)
            arrays[name] = scratch[key]
        alias = self._assemble.alias if self._assemble is not None else None
        if alias is not None and alias in arrays and "sparse.values" in placed:
            arrays[alias] = placed["sparse.values"].reshape(arrays[alias].shape)
            arrays["sparse.aliased"] = alias  # what AssembleSparse then finds written already
        arrays["index"], arrays["valid"] = placed.get("index"), placed.get("valid")
        return arrays

    def _cpu_data(self, plan: BatchPlan, out: dict[str, np.ndarray], timed: dict[str, float] | None = None
                  ) -> dict[str, Any]:
        started = time.thread_time() if timed is not None else 0.0
        if self._folded is not None:
            data, bad, charged, spent = self._folded.read(self._prepared, plan.indices, out, charge=timed is not None)
        else:
            data, bad = self._parse.read(self.source, plan.indices, out)
        data["valid"] = plan.valid & ~bad
        done = 1
        if timed is not None:
            took = time.thread_time() - started
            if self._folded is not None:  # the gather's own time, and each folded stage's share of preparing
                took += charged.get(self._parse.name, 0.0) - spent
                for stage in self._folded.stages:
                    timed[stage.name] = timed.get(stage.name, 0.0) + charged.get(stage.name, 0.0)
            timed[self._parse.name] = timed.get(self._parse.name, 0.0) + took
        if self._folded is not None:
            done += len(self._folded.stages)
        for stage in self._cpu_stages[done:]:
            started = time.thread_time() if timed is not None else 0.0
            data.update(stage.run(data, np, out))
            if timed is not None:
                timed[stage.name] = timed.get(stage.name, 0.0) + time.thread_time() - started
        return data

    def _buffer(self, nbytes: int) -> tuple[Any, np.ndarray]:
        """A batch's buffer: (torch tensor, NumPy view): from the ring on the CPU, pinned for a GPU."""
        if self._ring is not None:
            tensor = self._ring.empty((nbytes,), torch.uint8)
        else:
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return tensor, tensor.numpy()

    def _host_part(self, plan: BatchPlan, timed: dict[str, float] | None = None):
        """The CPU stages of ``plan``'s batch, written into its buffer: on the CPU the batch itself (tensors
        viewing the buffer), for a GPU (pinned buffer tensor, unpack layout)."""
        rows = plan.indices.size
        layout, _ = self._layout(rows)
        tensor, buffer = self._buffer(layout.nbytes)
        out = self._arrays(rows, buffer)
        data = self._cpu_data(plan, out, timed)
        moving = {name: data[name] for name in self._crossing} if self.on_gpu else \
            transfer.plain(data, self.spec.outputs)
        out["index"][...] = plan.indices
        moving["index"] = out["index"]
        if not data["valid"].all():  # padding, and bad rows skipped in their places
            out["valid"][...] = data["valid"]
            moving["valid"] = out["valid"]
        if self.device.type == "cpu":  # each tensor keeps the ring's buffer taken while the trainer holds it
            return transfer.convert(moving, torch.from_numpy)
        if not self.on_gpu:  # the shared outputs are on the device already
            for name in self._constants(rows):
                group, _, key = name.partition(".")
                del moving[group][key]
        where = transfer.layout_in(buffer, moving)
        if where is None:  # something of unknown size (list columns, multi-hot keys): packed again, once
            return self._pack(moving)
        if "valid" not in moving:  # (its place is last): the copy stops before it
            tensor = tensor[:layout.places["valid"][0]]
        return tensor, where

    def _pack(self, moving: dict) -> tuple[torch.Tensor, tuple]:
        """``moving`` copied into a buffer of its own. The tensor handed on is the one the buffer was allocated
        as: a copy from pinned memory records its stream on that tensor, which keeps the memory from being
        handed out again while the copy runs."""
        allocated = []

        def allocate(nbytes: int) -> np.ndarray:
            tensor, view = self._buffer(nbytes)
            allocated.append(tensor)
            return view

        _, layout = transfer.pack(moving, allocate)
        return allocated[0], layout

    # ---- the device part ------------------------------------------------------------------------------
    def _device_part(self, plan: BatchPlan, host) -> dict[str, Any]:
        if self.device.type == "cpu":
            batch = host
        elif not self.on_gpu:
            tensor, layout = host
            batch = transfer.unpack(tensor.to(self.device, non_blocking=True), layout, transfer.torch_view)
            for name, shared in self._on_device(plan.indices.size).items():
                group, _, key = name.partition(".")
                batch[group][key] = shared
        else:
            batch = self._run_gpu(host)
        if "sparse" in batch:
            batch["sparse"] = {"keys": list(self._keys), **batch["sparse"]}
        return batch

    def _on_device(self, rows: int) -> dict[str, torch.Tensor]:
        """The shared outputs of a batch of ``rows`` rows on the device, copied there once."""
        shared = self._device_shared.get(rows)
        if shared is None:
            shared = self._device_shared[rows] = {name: torch.from_numpy(array).to(self.device)
                                                  for name, array in self._constants(rows).items()}
        return shared

    def _run_gpu(self, host, timed: dict[str, float] | None = None) -> dict[str, Any]:
        import cupy

        tensor, layout = host
        with cupy.cuda.Device(self.device.index or 0), \
                cupy.cuda.ExternalStream(torch.cuda.current_stream(self.device).cuda_stream) as stream:
            on_device = tensor.to(self.device, non_blocking=True)
            data = transfer.unpack(cupy.asarray(on_device), layout, transfer.cupy_view)
            out = self.run_stages(data, cupy, stream, timed)
            return transfer.convert(out, torch.from_dlpack)

    def run_stages(self, data: dict[str, Any], xp, stream=None, timed: dict[str, float] | None = None) -> dict:
        """The GPU stages over ``data`` (the arrays that crossed, as ``xp`` arrays): the outputs, ``index`` and
        ``valid``. ``stream``: synchronised around each stage when timing it."""
        for stage in self._gpu_stages:
            if timed is not None:
                stream.synchronize()
                started = time.perf_counter()
            data.update(stage.run(data, xp))
            if timed is not None:
                stream.synchronize()
                timed[stage.name] = timed.get(stage.name, 0.0) + time.perf_counter() - started
        out = transfer.plain(data, self.spec.outputs)
        out.update({name: data[name] for name in ("index", "valid") if name in data})
        return out

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """Each CPU stage's thread time and each GPU stage's synchronised time, on this thread, batch by batch."""
        seconds: dict[str, float] = {}
        out_bytes: dict[str, float] = {}
        samples = 0
        for plan in plans:
            rows = plan.indices.size
            data = self._cpu_data(plan, self._arrays(rows, None), seconds)
            shapes = self._layout(rows)[1]
            for stage in self._cpu_stages:  # (arrays a folded stage never makes whole: the size they would have)
                out_bytes[stage.name] = out_bytes.get(stage.name, 0.0) + sum(
                    _nbytes(data[k]) if k in data else _declared_nbytes(shapes, k) for k in stage.produces)
            if self.on_gpu:
                self._run_gpu(self._pack({name: data[name] for name in self._crossing}), seconds)
            samples += rows
        per_sample = {k: v / samples for k, v in out_bytes.items()}
        first = self.spec.stages[0].name
        source_bytes = float(getattr(self.source, "bytes_per_row", 0.0) or per_sample.get(first, 0.0))
        return StageTimes(samples, seconds, per_sample, source_bytes)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=_may_join(), cancel_futures=True)
            self._pool = None


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
