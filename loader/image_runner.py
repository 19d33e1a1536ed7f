"""Runs an image pipeline for one placement: host-side reading and geometry, DALI decoding, the rest in
DALI on the GPU or as torch ops on the CPU (see ``dali_graph.engines``), torch tensors out.

The DALI pipeline is built once and fed batch by batch through one external source, so epochs never restart
it and the order, sharding and resumption stay with the Loader.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
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
from .errors import DataError
from .image_headers import DEFAULT_MAX_PIXELS, displayed_size, read_bytes
from .image_torch_ops import Finish, one_thread, resize
from .sampler import BatchPlan

_FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")


@dataclass
class HostBatch:
    """What the host computed for one batch: DALI's inputs and the geometry the torch stages need."""

    plan: BatchPlan
    feeds: dict[str, object]
    flip: np.ndarray            # bool per sample
    resize_to: np.ndarray       # int32 [n, 2] (w, h) that each decoded image is resized to
    crop_at: np.ndarray | None  # int32 [n, 2] (x, y) of the output window in the resized image (val)


class ImageRunner:
    def __init__(self, spec: PipelineSpec, cut: int, device: torch.device, *, batch_size: int, seed: int,
                 num_threads: int, prefetch: int, max_pixels: int = DEFAULT_MAX_PIXELS):
        self.spec = spec
        self.files: ImageFiles = spec.source
        self.num_samples = len(self.files)
        self.cut = cut
        self.device = device
        self.batch_size = batch_size
        self.seed = seed
        self.num_threads = num_threads
        self.prefetch = prefetch
        self.max_pixels = max_pixels
        self.params = {s.name: s.params for s in spec.stages}
        self.engines = dali_graph.engines(spec, cut)
        self.inputs = dali_graph.inputs(spec, cut)
        norm = self.params["normalize"]
        self.size = norm["crop"] if "crop" in norm else self.params["resize"]["size"]
        self.finish = Finish(norm["output"], norm["mean"], norm["std"])
        self.staging = Finish(ImageOutput.UINT8_NHWC, norm["mean"], norm["std"])
        self._sizes = np.full((self.num_samples, 2), -1, dtype=np.int64)  # header sizes, read once
        self._pipe = None
        self._fresh = True
        self._plans: Iterator[BatchPlan] = iter(())
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
            self._pipe = pipe
        return self._pipe

    def host_batch(self, plan: BatchPlan) -> HostBatch:
        paths = [self.files.paths[i] for i in plan.indices]
        encoded = [read_bytes(p) for p in paths]
        sizes = self._sizes[plan.indices]
        for k in np.flatnonzero(sizes[:, 0] < 0):
            sizes[k] = self._sizes[plan.indices[k]] = displayed_size(encoded[k], paths[k], self.max_pixels)
        width, height = sizes[:, 0], sizes[:, 1]
        if self.spec.name == "image-train":
            p = self.params["crop_window"]
            u = uniform(self.seed, plan.epoch, plan.indices, 2 * geometry.ATTEMPTS + 3)
            window = geometry.random_resized_crop(width, height, u[:, :-1], p["scale"], p["ratio"])
            flip = u[:, -1] < p["flip_prob"]
            feeds = {"encoded": encoded, "anchor": window[:, :2].copy(), "shape": window[:, 2:].copy(),
                     "flip": flip.astype(np.int32)}
            resize_to = np.tile(np.asarray(self.size, dtype=np.int32), (len(paths), 1))
            return HostBatch(plan, feeds, flip, resize_to, None)
        p = self.params["geometry"]
        resize_to = geometry.resize_shorter(width, height, p["resize_size"])
        crop_at = geometry.centre_crop_anchor(resize_to[:, 0], resize_to[:, 1], p["size"])
        feeds = {"encoded": encoded, "resize_w": resize_to[:, 0].astype(np.float32),
                 "resize_h": resize_to[:, 1].astype(np.float32), "crop_anchor": crop_at}
        return HostBatch(plan, feeds, np.zeros(len(paths), dtype=bool), resize_to, crop_at)

    def _next_inputs(self) -> tuple:
        """DALI's external source: feeds the next plan's inputs, or ends the stream."""
        plan = next(self._plans, None)
        if plan is None:
            raise StopIteration
        host = self.host_batch(plan)
        self._pending.append(host)
        return tuple(host.feeds[name] for name in self.inputs)

    def batches(self, plans: Iterator[BatchPlan]) -> Iterator[dict[str, torch.Tensor]]:
        pipe = self._pipeline()
        self._plans = iter(plans)
        finished = False
        try:
            # A fresh DALI pipeline fills its whole prefetch queue on the first schedule_run.
            for _ in range(1 if self._fresh else self.prefetch):
                pipe.schedule_run()
            self._fresh = False
            while True:
                try:
                    (images,) = pipe.outputs()
                except StopIteration:
                    finished = True
                    return
                except RuntimeError as exc:
                    raise self._decode_failure(self._pending[0].plan, exc) from None
                host = self._pending.popleft()
                plan = host.plan
                batch = {"image": self._images(images, host), "label": torch.from_numpy(self.files.labels[plan.indices]),
                         "index": torch.from_numpy(plan.indices.copy())}
                if not plan.valid.all():
                    batch["valid"] = torch.from_numpy(plan.valid.copy())
                pipe.schedule_run()
                yield batch
        finally:
            if self._pipe is None:
                pass  # the failed pipeline was discarded; the next call builds a fresh one
            elif finished:
                pipe.reset()
                self._fresh = True
            else:
                while self._pending:
                    self._pending.popleft()
                    pipe.outputs()

    def _images(self, images, host: HostBatch) -> torch.Tensor:
        if self.engines["resize"] == "dali:gpu":
            return self._from_dali_gpu(images)
        height, width = self.size[1], self.size[0]
        tail_on_gpu = self.engines["normalize"] == "torch:cuda"
        stage = self.staging if tail_on_gpu else self.finish
        out = stage.allocate(len(images), height, width, pin=self.device.type == "cuda")
        with one_thread():
            for i in range(len(images)):
                hwc = torch.from_numpy(np.asarray(images[i]))
                new_w, new_h = host.resize_to[i]
                chw = resize(hwc, int(new_h), int(new_w))
                if host.crop_at is not None:
                    x, y = host.crop_at[i]
                    chw = chw[:, y:y + height, x:x + width]
                stage.into(out, i, chw, flip=bool(host.flip[i]) and not tail_on_gpu)
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

    def _decode_failure(self, plan: BatchPlan, exc: RuntimeError) -> DataError:
        """DALI invalidates a pipeline that fails to decode; name the file at fault and start afresh."""
        self._pipe, self._fresh = None, True
        self._pending.clear()
        paths = [self.files.paths[i] for i in plan.indices]
        match = _FAILED_SAMPLE.search(str(exc))
        suspects = [paths[int(match.group(1))]] if match and int(match.group(1)) < len(paths) else paths
        for path in suspects:
            try:
                with Image.open(path) as im:
                    im.load()
            except Exception as err:
                return DataError(path, f"image data is corrupt or truncated and cannot be decoded ({err})")
        if len(suspects) == 1:
            return DataError(suspects[0], "image data is corrupt and cannot be decoded")
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return DataError(f"batch of {len(paths)} files from {paths[0]}", f"DALI failed: {last}")

    def close(self) -> None:
        self._pipe = None
