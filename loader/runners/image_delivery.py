"""An image batch as the trainer gets it: DALI's output through the torch stages into ``image``, with ``label``,
``index``, ``valid`` where a sample is not, and padding rows (zero images, label and index -1, ``valid`` False)
where an epoch's planned batches outlast its good samples."""
from __future__ import annotations

import numpy as np
import torch

from ...pipelines.imaging.types import Dtype, ImageType
from .contract import NO_TIMER, StageTimer
from .image_batches import HostBatch
from .image_graph import ImageGraph
from .image_torch import TorchStages, as_nchw, one_thread


class ImageDelivery:
    """``labels``: the source's (None: it has none); ``device``: where batches are delivered."""

    def __init__(self, graph: ImageGraph, stages: TorchStages, labels: np.ndarray | None, device: torch.device):
        self.graph = graph
        self.stages = stages
        self.labels = labels
        self.device = device

    def batch(self, images, host: HostBatch, timer: StageTimer = NO_TIMER) -> dict[str, torch.Tensor]:
        """The batch of DALI's output ``images`` for ``host``."""
        return self._with_labels(self._images(images, host, timer), host)

    def stored(self, images: torch.Tensor, host: HostBatch) -> dict[str, torch.Tensor]:
        """The batch of ``images``, the finished rows of ``host``'s good samples as a cache kept them."""
        return self._with_labels(images.to(self.device), host)

    def _with_labels(self, images: torch.Tensor, host: HostBatch) -> dict[str, torch.Tensor]:
        indices = np.array([s.index for s in host.good], dtype=np.int64)
        valid = np.array([s.valid for s in host.good], dtype=bool)
        batch = {"image": images}
        if self.labels is not None:
            batch["label"] = torch.from_numpy(self.labels[indices])
        batch["index"] = torch.from_numpy(indices)
        if not valid.all():
            batch["valid"] = torch.from_numpy(valid)
        return _padded(batch, host.pad) if host.pad else batch

    def padding(self, host: HostBatch) -> dict[str, torch.Tensor]:
        """A batch of padding only: its epoch ran out of good samples before its planned batches did."""
        out = self.graph.output
        h, w = out.size
        row = (h, w, out.channels) if out.dtype is Dtype.UINT8 else (out.channels, h, w)
        dtype = torch.uint8 if out.dtype is Dtype.UINT8 else torch.float32
        empty = {"image": torch.zeros((0, *row), dtype=dtype, device=self.device)}
        if self.labels is not None:
            empty["label"] = torch.zeros(0, dtype=torch.int64)
        empty["index"] = torch.zeros(0, dtype=torch.int64)
        return _padded(empty, host.pad)

    def _images(self, images, host: HostBatch, timer: StageTimer) -> torch.Tensor:
        last_in_dali = self.graph.types[self.graph.in_dali - 1]
        if self.graph.dali_on_gpu:
            current = _from_dali_gpu(images, last_in_dali, self.device, nchw=bool(self.graph.torch_steps))
            if not self.graph.torch_steps:
                return current
        else:
            current = [torch.from_numpy(np.asarray(images[i])).permute(2, 0, 1) for i in range(len(images))]
        with one_thread():
            return self.stages.run(current, host.params, self.device, timer)


def _padded(batch: dict[str, torch.Tensor], pad: int) -> dict[str, torch.Tensor]:
    """``batch`` with ``pad`` padding rows after its samples."""
    image = batch["image"]
    valid = batch.get("valid", torch.ones(image.shape[0], dtype=torch.bool))
    padded = {"image": torch.cat([image, image.new_zeros((pad, *image.shape[1:]))])}
    if "label" in batch:
        padded["label"] = torch.cat([batch["label"], torch.full((pad,), -1, dtype=torch.int64)])
    padded["index"] = torch.cat([batch["index"], torch.full((pad,), -1, dtype=torch.int64)])
    padded["valid"] = torch.cat([valid, torch.zeros(pad, dtype=torch.bool)])
    return padded


def _from_dali_gpu(images, image: ImageType, device: torch.device, nchw: bool):
    """DALI's GPU output as torch on ``device``: the stored batch where images have one size (its ``NCHW``
    view where ``nchw``), else one tensor each (``CHW``)."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    stream = torch.cuda.current_stream(device)
    dtype = torch.uint8 if image.dtype is Dtype.UINT8 else torch.float32
    if image.size is not None:
        tensor = images.as_tensor()
        out = torch.empty(tuple(tensor.shape()), dtype=dtype, device=device)
        feed_ndarray(tensor, out, cuda_stream=stream)
        return as_nchw(out, image) if nchw else out
    out = []
    for i in range(len(images)):
        sample = images[i]
        t = torch.empty(tuple(sample.shape()), dtype=dtype, device=device)
        feed_ndarray(sample, t, cuda_stream=stream)
        out.append(t.permute(2, 0, 1) if image.dtype is Dtype.UINT8 else t)
    return out
