"""Runs an image pipeline for one placement: host-side reading and geometry, DALI decoding, the rest in
DALI on the GPU or as torch ops on the CPU (see ``dali_graph.engines``), torch tensors out.

The DALI pipeline is built once and fed batch by batch through one external source, so epochs never restart
it and the order, sharding and resumption stay with the Loader.
"""
from __future__ import annotations

import logging
import re
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from ..pipelines import geometry
from ..pipelines.counter_rng import uniform
from ..pipelines.image import ImageOutput
from ..pipelines.image_files import ImageFiles
from ..pipelines.spec import PipelineSpec
from . import dali_graph
from .buffers import BufferRing
from .errors import DataError, OnError, Skipped
from .image_headers import DEFAULT_MAX_PIXELS, displayed_size, read_bytes
from .image_torch_ops import Finish, one_thread, resize
from .runner import BatchInfo
from .sampler import BatchPlan

log = logging.getLogger("feedline")
_FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")


@dataclass(frozen=True)
class Sample:
    epoch: int
    index: int
    valid: bool
    position: int  # in this rank's order for the epoch


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
            self._items.extend(Sample(plan.epoch, i, v, plan.start + k)
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
    """One batch as the host prepared it: the samples taken (bad ones included), DALI's inputs, and the
    geometry the torch stages need. A batch whose samples were all bad has no inputs and only ends an epoch."""

    taken: list[Sample]
    good: list[Sample]
    info: BatchInfo
    feeds: dict[str, object] = field(default_factory=dict)
    flip: np.ndarray | None = None       # bool per sample
    resize_to: np.ndarray | None = None  # int32 [n, 2] (w, h) that each decoded image is resized to
    crop_at: np.ndarray | None = None    # int32 [n, 2] (x, y) of the output window in the resized image (val)


class ImageRunner:
    yields_info = True

    def __init__(self, spec: PipelineSpec, cut: int, device: torch.device, *, batch_size: int, seed: int,
                 num_threads: int, prefetch: int, on_error: OnError = OnError.RAISE,
                 max_pixels: int = DEFAULT_MAX_PIXELS):
        self.spec = spec
        self.files: ImageFiles = spec.source
        self.num_samples = len(self.files)
        self.cut = cut
        self.device = device
        self.batch_size = batch_size
        self.seed = seed
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.on_error = on_error
        self.max_pixels = max_pixels
        self.params = {s.name: s.params for s in spec.stages}
        self.engines = dali_graph.engines(spec, cut)
        self.inputs = dali_graph.inputs(spec, cut)
        norm = self.params["normalize"]
        self.size = norm["crop"] if "crop" in norm else self.params["resize"]["size"]
        self.finish = Finish(norm["output"], norm["mean"], norm["std"])
        self.staging = Finish(ImageOutput.UINT8_NHWC, norm["mean"], norm["std"])
        self.skipped: dict[int, Skipped] = {}      # dataset index -> first skip, in the order met
        self.skip_events: list[Skipped] = []       # every skip, every epoch
        self._undecodable: dict[int, DataError] = {}
        self.stage_seconds: dict[str, float] | None = None  # thread seconds per host/torch stage, when profiling
        self._sizes = np.full((self.num_samples, 2), -1, dtype=np.int64)  # header sizes, read once
        self._outputs = BufferRing(capacity=prefetch + 2)
        self._pipe = None
        self._fresh = True
        self._queue = SampleQueue(iter(()))
        self._pending: deque[HostBatch] = deque()

    @property
    def on_gpu(self) -> bool:
        return self.cut < self.spec.all_cpu

    def _pipeline(self):
        if self._pipe is None:
            from nvidia.dali import Pipeline

            device_id = (self.device.index or 0) if self.on_gpu else None
            pipe = Pipeline(batch_size=self.batch_size, num_threads=self.num_threads, device_id=device_id,
                            prefetch_queue_depth=self.prefetch, seed=self.seed)
            with pipe:
                pipe.set_outputs(dali_graph.define(self.spec, self.cut, self._next_inputs))
            pipe.build()
            self._pipe, self._fresh = pipe, True
        return self._pipe

    def _read(self, sample: Sample) -> tuple[np.ndarray, np.ndarray]:
        path = self.files.paths[sample.index]
        if sample.index in self._undecodable:
            raise self._undecodable[sample.index]
        data = read_bytes(path)
        size = self._sizes[sample.index]
        if size[0] < 0:
            size[:] = displayed_size(data, path, self.max_pixels)
        return data, size

    def _skip(self, error: DataError, sample: Sample) -> None:
        record = Skipped(error.where, error.reason, sample.index, sample.epoch)
        self.skip_events.append(record)
        if sample.index not in self.skipped:
            self.skipped[sample.index] = record
            log.warning("feedline: skipped %s: %s", error.where, error.reason)

    def _assemble(self) -> HostBatch | None:
        """Take samples until the batch holds ``batch_size`` good ones or the epoch ends."""
        first = self._queue.peek()
        if first is None:
            return None
        taken, good, encoded, sizes = [], [], [], []
        while len(good) < self.batch_size:
            sample = self._queue.peek()
            if sample is None or sample.epoch != first.epoch:
                break
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
        after = self._queue.peek()
        info = BatchInfo(first.epoch, taken[-1].position + 1, after is None or after.epoch != first.epoch)
        batch = HostBatch(taken, good, info)
        if good:
            self._geometry(batch, encoded, np.array(sizes, dtype=np.int64).reshape(-1, 2))
        return batch

    def _geometry(self, batch: HostBatch, encoded: list[np.ndarray], sizes: np.ndarray) -> None:
        width, height = sizes[:, 0], sizes[:, 1]
        indices = np.array([s.index for s in batch.good], dtype=np.int64)
        if self.spec.name == "image-train":
            p = self.params["crop_window"]
            u = uniform(self.seed, batch.info.epoch, indices, 2 * geometry.ATTEMPTS + 3)
            window = geometry.random_resized_crop(width, height, u[:, :-1], p["scale"], p["ratio"])
            batch.flip = u[:, -1] < p["flip_prob"]
            batch.feeds = {"encoded": encoded, "anchor": window[:, :2].copy(), "shape": window[:, 2:].copy(),
                           "flip": batch.flip.astype(np.int32)}
            batch.resize_to = np.tile(np.asarray(self.size, dtype=np.int32), (len(indices), 1))
            return
        p = self.params["geometry"]
        batch.resize_to = geometry.resize_shorter(width, height, p["resize_size"])
        batch.crop_at = geometry.centre_crop_anchor(batch.resize_to[:, 0], batch.resize_to[:, 1], p["size"])
        batch.flip = np.zeros(len(indices), dtype=bool)
        batch.feeds = {"encoded": encoded, "resize_w": batch.resize_to[:, 0].astype(np.float32),
                       "resize_h": batch.resize_to[:, 1].astype(np.float32), "crop_anchor": batch.crop_at}

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
            started = time.thread_time()
            batch = self._assemble()
            if self.stage_seconds is not None:
                self.stage_seconds["host"] += time.thread_time() - started
            if batch is None:
                raise StopIteration
            self._pending.append(batch)
            if batch.good:
                return tuple(batch.feeds[name] for name in self.inputs)

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[tuple[dict[str, torch.Tensor] | None, BatchInfo]]:
        """Yields ``(batch, info)``; ``batch`` is None for an epoch end with no good sample left to deliver."""
        self._queue = SampleQueue(plans)
        pipe = self._pipeline()
        finished = False
        try:
            self._prime(pipe)
            while True:
                if self._pending and not self._pending[0].good:
                    yield None, self._pending.popleft().info
                    continue
                try:
                    (images,) = pipe.outputs()
                except StopIteration:
                    finished = True
                    while self._pending:
                        yield None, self._pending.popleft().info
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
        indices = np.array([s.index for s in host.good], dtype=np.int64)
        valid = np.array([s.valid for s in host.good], dtype=bool)
        batch = {"image": self._images(images, host), "label": torch.from_numpy(self.files.labels[indices]),
                 "index": torch.from_numpy(indices)}
        if not valid.all():
            batch["valid"] = torch.from_numpy(valid)
        return batch

    def _recover(self, exc: RuntimeError) -> None:
        """DALI invalidates a pipeline that fails to decode. Name the sample at fault; with ``skip``, mark it,
        push every pending batch's samples back and let a fresh pipeline form them again."""
        failed = next(h for h in self._pending if h.good)
        self._pipe, self._fresh = None, True
        sample, error = self._decode_failure(failed, exc)
        if self.on_error is OnError.RAISE or sample is None:
            self._pending.clear()
            raise error from None
        self._undecodable[sample.index] = error
        self._queue.push_front([s for host in self._pending for s in host.taken])
        self._pending.clear()

    def _images(self, images, host: HostBatch) -> torch.Tensor:
        if self.engines["resize"] == "dali:gpu":
            return self._from_dali_gpu(images)
        height, width = self.size[1], self.size[0]
        tail_on_gpu = self.engines["normalize"] == "torch:cuda"
        stage = self.staging if tail_on_gpu else self.finish
        if self.device.type == "cuda":
            out = stage.allocate(len(images), height, width, pin=True)  # torch caches pinned blocks itself
        else:
            out = self._outputs.empty(*stage.layout(len(images), height, width))
        clock = self.stage_seconds is not None
        with one_thread():
            for i in range(len(images)):
                hwc = torch.from_numpy(np.asarray(images[i]))
                new_w, new_h = host.resize_to[i]
                t0 = time.thread_time() if clock else 0.0
                chw = resize(hwc, int(new_h), int(new_w))
                if host.crop_at is not None:
                    x, y = host.crop_at[i]
                    chw = chw[:, y:y + height, x:x + width]
                t1 = time.thread_time() if clock else 0.0
                stage.into(out, i, chw, flip=bool(host.flip[i]) and not tail_on_gpu)
                if clock:
                    self.stage_seconds["resize"] += t1 - t0
                    self.stage_seconds["normalize"] += time.thread_time() - t1
        if tail_on_gpu:
            return self.finish.batch(out.to(self.device, non_blocking=True), torch.from_numpy(host.flip))
        return out.to(self.device, non_blocking=True) if self.device.type == "cuda" else out

    def _from_dali_gpu(self, images) -> torch.Tensor:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        tensor = images.as_tensor()
        dtype = torch.uint8 if self.finish.output is ImageOutput.UINT8_NHWC else torch.float32
        out = torch.empty(tuple(tensor.shape()), dtype=dtype, device=self.device)
        feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(self.device))
        return out

    def _decode_failure(self, host: HostBatch, exc: RuntimeError) -> tuple[Sample | None, DataError]:
        paths = [self.files.paths[s.index] for s in host.good]
        match = _FAILED_SAMPLE.search(str(exc))
        suspects = [int(match.group(1))] if match and int(match.group(1)) < len(paths) else range(len(paths))
        for k in suspects:
            try:
                with Image.open(paths[k]) as im:
                    im.load()
            except Exception as err:
                return host.good[k], DataError(paths[k], f"image data is corrupt or truncated and cannot be "
                                                         f"decoded ({err})")
        for k in suspects:  # PIL accepted them all: ask DALI about each file on its own
            if not _dali_decodes(paths[k]):
                return host.good[k], DataError(paths[k], "image data is corrupt and the decoder rejects it")
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return None, DataError(f"batch of {len(paths)} files from {paths[0]}", f"DALI failed: {last}")

    def close(self) -> None:
        self._pipe = None


def _dali_decodes(path: str) -> bool:
    """Whether DALI's CPU decoder accepts one file on its own (used only after a batch failed)."""
    from nvidia.dali import Pipeline, fn, types

    data = np.fromfile(path, dtype=np.uint8)
    pipe = Pipeline(batch_size=1, num_threads=1, device_id=None)
    with pipe:
        pipe.set_outputs(fn.decoders.image(fn.external_source(source=lambda: [data], batch=True, dtype=types.UINT8,
                                                              ndim=1), output_type=types.RGB))
    try:
        pipe.build()
        pipe.run()
        return True
    except RuntimeError:
        return False
