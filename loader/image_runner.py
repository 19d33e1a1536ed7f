"""Runs an image pipeline on DALI for one placement: host-side reading and geometry, DALI for decoding and
augmentation, torch tensors out. The DALI pipeline is built once and fed batch by batch, so epochs never
restart it and the order, sharding and resumption stay with the Loader."""
from __future__ import annotations

import re
from collections import deque
from typing import Iterator

import numpy as np
import torch
from PIL import Image

from ..pipelines import geometry
from ..pipelines.counter_rng import uniform
from ..pipelines.image_files import ImageFiles
from ..pipelines.spec import PipelineSpec
from . import dali_graph
from .errors import DataError
from .image_headers import DEFAULT_MAX_PIXELS, displayed_size, read_bytes
from .sampler import BatchPlan


_FAILED_SAMPLE = re.compile(r"Failed to decode sample #(\d+)")


class ImageRunner:
    def __init__(self, spec: PipelineSpec, cut: int, device: torch.device, *, batch_size: int, seed: int,
                 num_threads: int, prefetch: int, max_pixels: int = DEFAULT_MAX_PIXELS):
        if spec.name not in dali_graph.INPUTS:
            raise ValueError(f"ImageRunner runs image pipelines, not {spec.name!r}")
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
        self._pipe = None
        self._fresh = True
        self._plans: Iterator[BatchPlan] = iter(())
        self._pending: deque[BatchPlan] = deque()

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

    def host_inputs(self, plan: BatchPlan) -> dict[str, object]:
        """Everything DALI is fed for one batch: encoded bytes and per-sample geometry."""
        paths = [self.files.paths[i] for i in plan.indices]
        encoded = [read_bytes(p) for p in paths]
        sizes = np.array([displayed_size(buf, p, self.max_pixels) for buf, p in zip(encoded, paths)],
                         dtype=np.int64).reshape(-1, 2)
        width, height = sizes[:, 0], sizes[:, 1]
        if self.spec.name == "image-train":
            p = self.params["crop_window"]
            u = uniform(self.seed, plan.epoch, plan.indices, 2 * geometry.ATTEMPTS + 3)
            window = geometry.random_resized_crop(width, height, u[:, :-1], p["scale"], p["ratio"])
            flip = (u[:, -1] < p["flip_prob"]).astype(np.int32)
            return {"encoded": encoded, "anchor": window[:, :2].copy(), "shape": window[:, 2:].copy(), "flip": flip}
        p = self.params["geometry"]
        resized = geometry.resize_shorter(width, height, p["resize_size"])
        anchor = geometry.centre_crop_anchor(resized[:, 0], resized[:, 1], p["size"])
        return {"encoded": encoded, "resize_w": resized[:, 0].astype(np.float32),
                "resize_h": resized[:, 1].astype(np.float32), "crop_anchor": anchor}

    def _next_inputs(self) -> tuple:
        """DALI's external source: feeds the next plan's inputs, or ends the stream."""
        plan = next(self._plans, None)
        if plan is None:
            raise StopIteration
        inputs = self.host_inputs(plan)
        self._pending.append(plan)
        return tuple(inputs[name] for name in dali_graph.INPUTS[self.spec.name])

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
                    raise self._decode_failure(self._pending[0], exc) from None
                plan = self._pending.popleft()
                batch = {"image": self._to_torch(images), "label": torch.from_numpy(self.files.labels[plan.indices]),
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

    def _decode_failure(self, plan: BatchPlan, exc: RuntimeError) -> DataError:
        """DALI invalidates a pipeline that fails to decode; name the file at fault and start afresh."""
        self._pipe, self._fresh = None, True
        self._pending.clear()
        paths = [self.files.paths[i] for i in plan.indices]
        match = _FAILED_SAMPLE.search(str(exc))
        if match and int(match.group(1)) < len(paths):
            suspects = [paths[int(match.group(1))]]
        else:
            suspects = paths
        for path in suspects:
            try:
                with Image.open(path) as im:
                    im.load()
            except Exception as err:
                return DataError(path, f"image data is corrupt or truncated and cannot be decoded ({err})")
        if len(suspects) == 1:
            return DataError(suspects[0], "image data is corrupt and cannot be decoded")
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        return DataError(f"batch of {len(paths)} files from {paths[0]}", f"DALI failed: {first}")

    def _to_torch(self, images) -> torch.Tensor:
        from nvidia.dali.plugin.pytorch import feed_ndarray

        tensor = images.as_tensor()
        dtype = torch.uint8 if str(tensor.dtype).endswith("UINT8") else torch.float32
        shape = tuple(tensor.shape())
        if self.on_gpu:
            out = torch.empty(shape, dtype=dtype, device=self.device)
            feed_ndarray(tensor, out, cuda_stream=torch.cuda.current_stream(self.device))
            return out
        out = torch.empty(shape, dtype=dtype, pin_memory=self.device.type == "cuda")
        feed_ndarray(tensor, out)
        return out.to(self.device, non_blocking=True) if self.device.type == "cuda" else out

    def close(self) -> None:
        self._pipe = None
