"""Runs an image pipeline for one placement: the host reads each file and its header and draws every stage's
parameters, DALI decodes (and runs the GPU stages that follow it in DALI), torch runs the rest (see
``image_graph`` for which engine runs what), torch tensors out.

The DALI pipeline is built once and fed batch by batch through one external source, so epochs never restart
it and the order, sharding and resumption stay with the Loader.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import re
import resource
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from ...pipelines.image import infer_types
from ...pipelines.image_params import StageParams
from ...pipelines.imaging.types import Dtype, ImageType
from ...pipelines.spec import PipelineSpec
from ..devices import is_gpu_failure
from ..errors import DataError, OnError, Skipped
from ..sampler import BatchPlan
from ..sources.image_files import ImageFiles
from . import image_graph
from .buffers import BufferRing
from .contract import BatchInfo, RunnerConfig, SkipFill, StageTimes
from .image_torch import TorchStages, as_nchw, one_thread

log = logging.getLogger("feedline")
PIXELS_PER_IMAGE = 1 << 24  # the default batch budget's share per image: 16.8 megapixels (48 MiB of RGB)
_FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")


def default_batch_pixels(batch_size: int, max_pixels: int) -> int:
    """The decoded pixels a batch may hold when ``max_batch_pixels`` is not given: ``PIXELS_PER_IMAGE`` per
    image of the batch, and never less than one image of ``max_pixels``."""
    return max(batch_size * PIXELS_PER_IMAGE, max_pixels)


@dataclass(frozen=True)
class Sample:
    epoch: int
    index: int
    valid: bool
    position: int      # in this rank's order for the epoch
    batch: int         # the number of the batch its plan was, in the epoch
    shard: int | None  # the epoch's samples on this rank (see BatchPlan)


@dataclass
class EpochFill:
    """How far the runner is in making one epoch's batches: the next batch's number, and whether any good
    sample came at all (in an epoch this stream began at its start)."""

    epoch: int
    batch: int
    shard: int | None
    from_start: bool
    good: int = 0
    finished: bool = False


class SampleQueue:
    """The Loader's plans as a stream of single samples, so that a batch can be filled past a bad sample and
    a failed batch can be pushed back and formed again."""

    def __init__(self, plans: Iterator[BatchPlan]):
        self._plans = iter(plans)
        self._items: deque[Sample] = deque()

    def peek(self) -> Sample | None:
        while not self._items:
            plan = next(self._plans, None)
            if plan is None:
                return None
            self._items.extend(Sample(plan.epoch, i, v, plan.start + k, plan.batch, plan.shard)
                               for k, (i, v) in enumerate(zip(plan.indices.tolist(), plan.valid.tolist())))
        return self._items[0]

    def pop(self) -> Sample:
        sample = self.peek()
        self._items.popleft()
        return sample

    def push_front(self, samples: list[Sample]) -> None:
        self._items.extendleft(reversed(samples))


@dataclass
class HostBatch:
    """One batch as the host prepared it: the samples taken (bad ones included), every image stage's
    parameters for the good ones, DALI's inputs, and ``pad`` slots that skipped samples left empty at the end
    of the epoch. A batch without good samples is all padding and never enters DALI."""

    taken: list[Sample]
    good: list[Sample]
    info: BatchInfo
    pad: int = 0
    fill_before: EpochFill | None = None  # the epoch's progress before this batch, to make it again
    params: list[dict] = field(default_factory=list)   # per image stage: name -> one row per good sample
    feeds: dict[str, object] = field(default_factory=dict)
    pixels: list[float] = field(default_factory=list)  # per image stage: mean output pixels per sample


class ImageRunner:
    def __init__(self, spec: PipelineSpec, source: ImageFiles, config: RunnerConfig, *,
                 gpu: torch.device | None = None):
        """``gpu``: the device that GPU-placed torch stages run on (default: ``config.device`` when it is a
        CUDA device, else ``cuda``); a test may pass the CPU to run them there."""
        self.spec = spec
        self.source = source
        self.num_samples = len(source)
        self.cut = config.cut
        self.device = config.device
        self.batch_size = config.batch_size
        self.seed = config.seed
        self.num_threads = config.num_threads
        self.prefetch = config.prefetch
        self.on_error = config.on_error
        self.max_pixels = config.max_pixels
        self.max_batch_pixels = config.max_batch_pixels or default_batch_pixels(config.batch_size, config.max_pixels)
        self.skip_fill = config.skip_fill
        import nvidia.dali  # noqa: F401  (now, on this thread: its exit hook must be registered before the Loader's)

        self.graph = image_graph.plan(spec, config.cut, infer_types(spec.stages[1:]))
        self.engines = self.graph.engines
        gpu = gpu or (self.device if self.device.type == "cuda" else torch.device("cuda"))
        self._outputs = BufferRing(capacity=config.prefetch + 3)  # queued, being made, with the trainer
        self._torch = TorchStages(self.graph, gpu, self._allocate)
        self._params = StageParams(self.graph.stages)
        self._feed_names = image_graph.feed_names(self.graph, self._params.example())
        self.skipped: list[Skipped] = []        # the first skip of each sample, in the order met
        self._skipped_indices: set[int] = set()
        self._undecodable: dict[int, DataError] = {}
        self._read_seconds: float | None = None  # thread seconds of the read stage, while profiling
        self._pixels: np.ndarray | None = None    # output pixels of each image stage, summed, while profiling
        self._pipe = None
        self._fresh = True
        self._queue = SampleQueue(iter(()))
        self._fill: EpochFill | None = None
        self._pending: deque[HostBatch] = deque()

    def _allocate(self, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        if pinned:
            return torch.empty(shape, dtype=dtype, pin_memory=True)  # torch caches pinned blocks itself
        return self._outputs.empty(shape, dtype)

    def _pipeline(self):
        if self._pipe is None:
            from nvidia.dali import Pipeline

            device_id = (self.device.index or 0) if self.graph.dali_on_gpu else None
            pipe = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads, device_id=device_id,
                            prefetch_queue_depth=self.prefetch, seed=self.seed)
            with pipe:
                pipe.set_outputs(image_graph.define(self.graph, self._feed_names, self._next_inputs))
            pipe.build()
            self._pipe, self._fresh = pipe, True
        return self._pipe

    def _read(self, sample: Sample) -> tuple[np.ndarray, np.ndarray]:
        if sample.index in self._undecodable:
            raise self._undecodable[sample.index]
        return self.source.read_checked(sample.index, self.max_pixels)

    def _skip(self, error: DataError, sample: Sample) -> None:
        if sample.index not in self._skipped_indices:
            self._skipped_indices.add(sample.index)
            self.skipped.append(Skipped(error.where, error.reason, sample.index, sample.epoch))
            log.warning("feedline: skipped %s: %s", error.where, error.reason)

    def _assemble(self) -> HostBatch | None:
        """The epoch's next batch: as many good samples as the batch's planned size, taken in order past the
        bad ones. Where the epoch runs out of samples first, the rest of the batch is padding, and so are any
        batches still planned: every rank makes exactly its planned batches of their planned sizes (a DDP job
        cannot hang on a rank that skipped more)."""
        if self.skip_fill is SkipFill.PADDING:
            return self._assemble_plan()
        first = self._queue.peek()
        before = dataclasses.replace(self._fill) if self._fill is not None else None
        fill = self._fill
        if fill is None or fill.finished:
            if first is None:
                return None
            fill = self._fill = EpochFill(first.epoch, first.batch, first.shard, from_start=first.position == 0)
        target = self.batch_size if fill.shard is None else min(self.batch_size,
                                                                 fill.shard - fill.batch * self.batch_size)
        taken, good, encoded, sizes = self._take(lambda sample, good: len(good) < target and
                                                 sample.epoch == fill.epoch)
        after = self._queue.peek()
        run_out = after is None or after.epoch != fill.epoch
        fill.batch += 1
        fill.good += len(good)
        fill.finished = run_out if fill.shard is None else fill.batch * self.batch_size >= fill.shard
        if fill.finished and fill.from_start and not fill.good:
            # Nothing on this rank can be delivered, ever; padding epoch after epoch would hide it.
            raise DataError(self.source.origin, f"every sample of epoch {fill.epoch} on this rank was bad and "
                                                f"skipped (first: {self.skipped[0].where}: {self.skipped[0].reason})")
        padded = run_out and fill.shard is not None
        end = fill.shard if padded else taken[-1].position + 1
        info = BatchInfo(fill.epoch, end, fill.finished, skipped=len(taken) - len(good))
        return self._prepare(HostBatch(taken, good, info, target - len(good) if padded else 0, before), encoded,
                             sizes)

    def _assemble_plan(self) -> HostBatch | None:
        """The next plan's batch from its own samples: those a bad sample leaves empty are padding, after the
        good ones (``SkipFill.PADDING``)."""
        first = self._queue.peek()
        if first is None:
            return None
        taken, good, encoded, sizes = self._take(lambda sample, good: (sample.epoch, sample.batch) ==
                                                 (first.epoch, first.batch))
        end = taken[-1].position + 1
        after = self._queue.peek()
        last = end >= first.shard if first.shard is not None else (after is None or after.epoch != first.epoch)
        info = BatchInfo(first.epoch, end, last, skipped=len(taken) - len(good))
        return self._prepare(HostBatch(taken, good, info, len(taken) - len(good)), encoded, sizes)

    def _take(self, more) -> tuple[list, list, list, list]:
        """Samples off the queue while ``more(sample, good so far)``, each read: taken, the good ones, their
        bytes and sizes (a bad one raises, or with on_error="skip" is listed and left out). The good ones'
        header pixels stay within ``max_batch_pixels`` (see ``_within_budget``)."""
        taken, good, encoded, sizes = [], [], [], []
        pixels = 0
        while True:
            sample = self._queue.peek()
            if sample is None or not more(sample, good):
                return taken, good, encoded, sizes
            taken.append(self._queue.pop())
            try:
                data, size = self._read(sample)
            except DataError as err:
                if self.on_error is OnError.RAISE:
                    raise
                self._skip(err, sample)
                continue
            good.append(sample)
            encoded.append(data)
            sizes.append(size)
            pixels = self._within_budget(good, encoded, sizes, pixels + int(size[0]) * int(size[1]))

    def _within_budget(self, good: list[Sample], encoded: list, sizes: list, pixels: int) -> int:
        """The batch's pixels once it is within budget. An image above its share of the budget
        (``max_batch_pixels / batch_size``) is at fault only where the batch would pass the budget: then the
        largest such image of the batch raises a DataError, or with on_error="skip" is left out, until the batch
        fits. Images within their share always fit together, so no ordinary image is ever blamed."""
        share = self.max_batch_pixels // self.batch_size
        while pixels > self.max_batch_pixels:
            k = max(range(len(sizes)), key=lambda j: int(sizes[j][0]) * int(sizes[j][1]))
            error = self._over_budget(k, good, sizes, pixels, share)
            if self.on_error is OnError.RAISE:
                raise error
            self._skip(error, good[k])
            pixels -= int(sizes[k][0]) * int(sizes[k][1])
            del good[k], encoded[k], sizes[k]
        return pixels

    def _over_budget(self, k: int, good: list[Sample], sizes: list, total: int, share: int) -> DataError:
        w, h = int(sizes[k][0]), int(sizes[k][1])
        others = sorted((j for j in range(len(good)) if j != k), key=lambda j: -int(sizes[j][0]) * int(sizes[j][1]))
        named = ", ".join(f"{self.source.where(good[j].index)} ({int(sizes[j][0])}x{int(sizes[j][1])})"
                          for j in others[:3])
        return DataError(self.source.where(good[k].index),
                         f"its {w}x{h} pixels (above its share of {share} of the batch's budget) with those of the "
                         f"batch's {len(good) - 1} other images (largest: {named or 'none'}) make {total} decoded "
                         f"pixels, above the batch's budget of {self.max_batch_pixels} (max_batch_pixels)")

    def _prepare(self, batch: HostBatch, encoded: list, sizes: list) -> HostBatch:
        """``batch`` with its good samples' stage parameters and DALI feeds."""
        if batch.good:
            indices = np.array([s.index for s in batch.good], dtype=np.int64)
            batch.params, batch.pixels = self._params.draw(self.seed, batch.info.epoch, indices,
                                                           np.array(sizes, dtype=np.int64).reshape(-1, 2))
            batch.feeds = image_graph.feeds(self.graph, encoded, batch.params)
        return batch

    def host_batch(self, plan: BatchPlan) -> HostBatch:
        """The host part of one plan on its own (for tests and profiling)."""
        saved = self._queue
        self._queue = SampleQueue(iter([plan]))
        try:
            return self._assemble()
        finally:
            self._queue = saved

    def _next_inputs(self) -> tuple:
        """DALI's external source: the next batch's inputs, or the end of the stream. Batches whose samples
        were all bad are queued as epoch ends without entering DALI."""
        while True:
            started = time.thread_time() if self._read_seconds is not None else 0.0
            batch = self._assemble()
            if self._read_seconds is not None:
                self._read_seconds += time.thread_time() - started
            if batch is None:
                raise StopIteration
            self._pending.append(batch)
            if batch.good:
                return tuple(batch.feeds[name] for name in self._feed_names)

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict[str, torch.Tensor] | None, BatchInfo]]:
        """Yields ``(batch, info)``, one per planned batch."""
        self._queue = SampleQueue(plans)
        self._fill = None
        pipe = self._pipeline()
        finished = False
        try:
            self._prime(pipe)
            while True:
                if self._pending and not self._pending[0].good:
                    host = self._pending.popleft()
                    yield self._padding(host), host.info
                    continue
                try:
                    (images,) = pipe.outputs()
                except StopIteration:
                    finished = True
                    while self._pending:
                        host = self._pending.popleft()
                        yield self._padding(host), host.info
                    return
                except RuntimeError as exc:
                    self._recover(exc)
                    pipe = self._pipeline()
                    self._prime(pipe)
                    continue
                host = self._pending.popleft()
                batch = self._batch(images, host)
                pipe.schedule_run()
                yield batch, host.info
        finally:
            if self._pipe is None:
                pass  # the failed pipeline was discarded; the next call builds a fresh one
            elif finished:
                pipe.reset()
                self._fresh = True
            else:
                for host in self._pending:
                    if host.good:
                        pipe.outputs()
                self._pending.clear()

    def _prime(self, pipe) -> None:
        # A fresh DALI pipeline fills its whole prefetch queue on the first schedule_run.
        for _ in range(1 if self._fresh else self.prefetch):
            pipe.schedule_run()
        self._fresh = False

    def _batch(self, images, host: HostBatch) -> dict[str, torch.Tensor]:
        if self._pixels is not None:
            self._pixels += np.asarray(host.pixels) * len(host.good)
        indices = np.array([s.index for s in host.good], dtype=np.int64)
        valid = np.array([s.valid for s in host.good], dtype=bool)
        batch = {"image": self._images(images, host)}
        if self.source.labels is not None:
            batch["label"] = torch.from_numpy(self.source.labels[indices])
        batch["index"] = torch.from_numpy(indices)
        if not valid.all():
            batch["valid"] = torch.from_numpy(valid)
        return self._padded(batch, host.pad) if host.pad else batch

    def _padded(self, batch: dict[str, torch.Tensor], pad: int) -> dict[str, torch.Tensor]:
        """``batch`` with ``pad`` padding rows after its samples: zero images, label and index -1, and
        ``valid`` False."""
        image = batch["image"]
        valid = batch.get("valid", torch.ones(image.shape[0], dtype=torch.bool))
        padded = {"image": torch.cat([image, image.new_zeros((pad, *image.shape[1:]))])}
        if "label" in batch:
            padded["label"] = torch.cat([batch["label"], torch.full((pad,), -1, dtype=torch.int64)])
        padded["index"] = torch.cat([batch["index"], torch.full((pad,), -1, dtype=torch.int64)])
        padded["valid"] = torch.cat([valid, torch.zeros(pad, dtype=torch.bool)])
        return padded

    def _padding(self, host: HostBatch) -> dict[str, torch.Tensor]:
        """A batch of padding only: its epoch ran out of good samples before its planned batches did."""
        out = self.graph.output
        h, w = out.size
        row = (h, w, out.channels) if out.dtype is Dtype.UINT8 else (out.channels, h, w)
        dtype = torch.uint8 if out.dtype is Dtype.UINT8 else torch.float32
        empty = {"image": torch.zeros((0, *row), dtype=dtype, device=self.device)}
        if self.source.labels is not None:
            empty["label"] = torch.zeros(0, dtype=torch.int64)
        empty["index"] = torch.zeros(0, dtype=torch.int64)
        return self._padded(empty, host.pad)

    def _recover(self, exc: RuntimeError) -> None:
        """DALI invalidates a pipeline that fails. Name the sample at fault; with ``skip``, mark it, push every
        pending batch's samples back and let a fresh pipeline form them again. Where no sample is at fault and
        DALI's message says the GPU failed (out of memory, nvJPEG, CUDA, a lost device), that error goes on as
        it is, for the Loader to move to the CPU."""
        failed = next(h for h in self._pending if h.good)
        self._pipe, self._fresh = None, True
        gpu_failed = is_gpu_failure(exc)
        sample, error = self._decode_failure(failed, exc, ask_dali=not gpu_failed)
        if sample is None and gpu_failed:
            self._pending.clear()
            raise exc
        if self.on_error is OnError.RAISE or sample is None:
            self._pending.clear()
            raise error from None
        self._undecodable[sample.index] = error
        self._queue.push_front([s for host in self._pending for s in host.taken])
        self._fill = self._pending[0].fill_before
        self._pending.clear()

    def _images(self, images, host: HostBatch) -> torch.Tensor:
        last_in_dali = self.graph.types[self.graph.in_dali - 1]
        if self.graph.dali_on_gpu:
            current = self._from_dali_gpu(images, last_in_dali)
            if not self.graph.torch_steps:
                return current
        else:
            current = [torch.from_numpy(np.asarray(images[i])).permute(2, 0, 1) for i in range(len(images))]
        with one_thread():
            return self._torch.run(current, host.params, self.device)

    def _from_dali_gpu(self, images, image: ImageType):
        """DALI's GPU output as torch: the stored batch where images have one size, else one tensor each."""
        from nvidia.dali.plugin.pytorch import feed_ndarray

        stream = torch.cuda.current_stream(self.device)
        dtype = torch.uint8 if image.dtype is Dtype.UINT8 else torch.float32
        if image.size is not None:
            tensor = images.as_tensor()
            out = torch.empty(tuple(tensor.shape()), dtype=dtype, device=self.device)
            feed_ndarray(tensor, out, cuda_stream=stream)
            return out if not self.graph.torch_steps else as_nchw(out, image)
        out = []
        for i in range(len(images)):
            sample = images[i]
            t = torch.empty(tuple(sample.shape()), dtype=dtype, device=self.device)
            feed_ndarray(sample, t, cuda_stream=stream)
            out.append(t.permute(2, 0, 1) if image.dtype is Dtype.UINT8 else t)
        return out

    def profile(self, plans: list[BatchPlan]) -> StageTimes:
        """The plans' batches on this placement. The read stage and the torch stages are timed in thread
        seconds; on the CPU, DALI's decoding is the process's CPU time less this thread's; with stages on the
        GPU, the batches are timed end to end with the device synchronised, as one group."""
        names = [s.name for s in self.spec.stages]
        self._read_seconds, self._torch.seconds = 0.0, {}
        self._pixels = np.zeros(len(self.graph.stages))
        sync = torch.cuda.synchronize if self.graph.dali_on_gpu or any(s.gpu for s in self.graph.torch_steps) \
            else (lambda: None)
        sync()
        cpu0, thread0, wall0 = _process_cpu(), time.thread_time(), time.perf_counter()
        samples = 0
        try:
            for batch, _ in self.batches(iter(plans)):
                if batch is not None:
                    samples += len(batch["index"])
            sync()
            wall = time.perf_counter() - wall0
            dali_cpu = max((_process_cpu() - cpu0) - (time.thread_time() - thread0), 0.0)
            seconds = {names[0]: self._read_seconds, **self._torch.seconds}
        finally:
            self._read_seconds, self._torch.seconds = None, None
            pixels, self._pixels = self._pixels / max(samples, 1), None
        indices = [i for p in plans for i in p.indices.tolist()]
        encoded = self.source.encoded_bytes(indices)
        bytes_out = {names[0]: encoded}
        for k, stage in enumerate(self.graph.stages):
            t = self.graph.types[k]
            per_pixel = t.channels * (1 if t.dtype is Dtype.UINT8 else 4)
            bytes_out[stage.name] = float(pixels[k] * per_pixel)
        together = {}
        on_gpu = tuple(n for n in names if self.engines[n] in (image_graph.DALI_MIXED, image_graph.DALI_GPU,
                                                               image_graph.TORCH_CUDA))
        if on_gpu:
            together[on_gpu] = wall
        else:
            seconds[self.graph.stages[0].name] = dali_cpu
        return StageTimes(samples, seconds, bytes_out, encoded, together)

    def close(self) -> None:
        self._pipe = None

    def _decode_failure(self, host: HostBatch, exc: RuntimeError, ask_dali: bool = True
                        ) -> tuple[Sample | None, DataError]:
        """The sample a failed batch is at fault for: the first that DALI's CPU decoder refuses on its own
        (DALI decides; the image library only words the reason). Without ``ask_dali`` (the message says the
        GPU failed), only a file the image library cannot decode either is blamed."""
        paths = [self.source.where(s.index) for s in host.good]
        match = _FAILED_SAMPLE.search(str(exc))
        suspects = [int(match.group(1))] if match and int(match.group(1)) < len(paths) else range(len(paths))
        decoder = _OneByOne() if ask_dali else None
        for k in suspects:
            data = self.source.read(host.good[k].index)
            why = _pil_refuses(data)
            if decoder.decodes(data) if decoder is not None else why is None:
                continue
            if why is not None:
                return host.good[k], DataError(paths[k], f"image data is corrupt or truncated and cannot be "
                                                         f"decoded ({why})")
            return host.good[k], DataError(paths[k], "image data is corrupt and the decoder rejects it")
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return None, DataError(f"batch of {len(paths)} files from {paths[0]}", f"DALI failed: {last}")


def _pil_refuses(data: np.ndarray) -> str | None:
    """Why the image library cannot decode these bytes, or None when it can."""
    try:
        with Image.open(io.BytesIO(data.tobytes())) as im:
            im.load()
        return None
    except Exception as err:
        return str(err) or type(err).__name__


class _OneByOne:
    """DALI's CPU decoder on one file at a time, the pipeline made again after each failure (which leaves a
    DALI pipeline unusable); used only to find the file a failed batch is at fault for."""

    def __init__(self):
        self._pipe = None
        self._data = None

    def decodes(self, data: np.ndarray) -> bool:
        from nvidia.dali import Pipeline, fn, types

        self._data = data
        if self._pipe is None:
            pipe = Pipeline(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1)
            with pipe:
                pipe.set_outputs(fn.decoders.image(fn.external_source(source=lambda: [self._data], batch=True,
                                                                      dtype=types.UINT8, ndim=1),
                                                   output_type=types.RGB))
            pipe.build()
            self._pipe = pipe
        try:
            self._pipe.run()
            return True
        except RuntimeError:
            self._pipe = None
            return False


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
