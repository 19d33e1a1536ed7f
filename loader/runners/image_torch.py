"""The stages of an image pipeline that run as torch ops (see ``image_graph``): image by image on the CPU,
each image finished while it is in cache and written into its row of the batch, and on whole batches on the
GPU, or on the CPU from a stage that needs a batch on.

uint8 batches are ``NHWC`` in memory (a channels-last ``NCHW`` view for the stages), float32 batches ``NCHW``.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from ...pipelines.imaging.base import per_sample
from ...pipelines.imaging.types import Dtype, ImageType
from .contract import NO_TIMER, StageTimer
from .image_graph import ImageGraph, TorchStep


@contextlib.contextmanager
def one_thread():
    """Per-image ops are too small to split; splitting them over OpenMP threads that DALI's decoder threads
    are already using makes every op wait on a busy core (measured: 14x slower). Restored on exit, so the
    trainer's own torch thread count is unchanged."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def batch_layout(image: ImageType, n: int) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of a batch of ``n`` images of type ``image`` as it lies in memory."""
    h, w = image.size
    if image.dtype is Dtype.UINT8:
        return (n, h, w, image.channels), torch.uint8
    return (n, image.channels, h, w), torch.float32


def as_nchw(batch: torch.Tensor, image: ImageType) -> torch.Tensor:
    """The stages' ``NCHW`` view of a batch as it lies in memory."""
    return batch.permute(0, 3, 1, 2) if image.dtype is Dtype.UINT8 else batch


def as_stored(nchw: torch.Tensor, image: ImageType) -> torch.Tensor:
    """A batch from the stages in its memory layout (uint8: ``NHWC``; float32: ``NCHW``), contiguous."""
    if image.dtype is Dtype.UINT8:
        return nchw.permute(0, 2, 3, 1).contiguous()
    return nchw.contiguous()


def write_row(batch: torch.Tensor, i: int, chw: torch.Tensor) -> None:
    """Image ``i`` (``CHW``) into a batch allocated with ``batch_layout``."""
    if batch.dtype == torch.uint8:
        torch.stack(tuple(chw.unbind(0)), dim=-1, out=batch[i])  # the fastest CHW -> HWC copy for uint8
    else:
        batch[i].copy_(chw)


def check_batch(step: TorchStep, out: object, n: int, expected: ImageType, device: torch.device) -> torch.Tensor:
    """A batch stage (a user's ``custom`` function above all) must return what it declared."""
    h, w = expected.size
    want = (n, expected.channels, h, w)
    dtype = torch.uint8 if expected.dtype is Dtype.UINT8 else torch.float32
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want or out.dtype != dtype \
            or out.device.type != device.type:
        got = (f"{type(out).__name__}" if not isinstance(out, torch.Tensor)
               else f"{out.dtype} {tuple(out.shape)} on {out.device}")
        raise ValueError(f"stage {step.stage.name!r} returned {got}; it declares {dtype} NCHW {want} on {device.type} "
                         f"(pass dtype= or size= to image.custom when it changes them)")
    return out


class TorchStages:
    """Runs a graph's torch steps on one batch. ``allocate(shape, dtype, pinned)`` gives the output or
    staging buffer; ``gpu`` is the device that GPU steps run on."""

    def __init__(self, graph: ImageGraph, gpu: torch.device, allocate: Callable):
        self.graph = graph
        self.gpu = gpu
        self.allocate = allocate
        self.runs = _runs(graph.torch_steps)

    def run(self, images: list[torch.Tensor] | torch.Tensor, params: list[dict], deliver_on: torch.device,
            timer: StageTimer = NO_TIMER) -> torch.Tensor:
        """``images``: the DALI part's output (``CHW`` views, or an ``NCHW`` batch); ``params``: per image
        stage, the batch's parameters. Returns the batch as delivered, on ``deliver_on``; ``timer`` adds up each
        stage's thread seconds."""
        n = len(images)
        current = images
        types = self.graph.types
        k_in = self.graph.in_dali - 1  # the image stage whose output ``current`` is
        for r, run in enumerate(self.runs):
            device = self.gpu if run[0].gpu else torch.device("cpu")
            then = deliver_on if r == len(self.runs) - 1 else self.gpu if self.runs[r + 1][0].gpu else torch.device("cpu")
            if run[0].batched:
                if isinstance(current, list):
                    current = self._stack(current, types[k_in], pinned=device.type == "cuda")
                current = current.to(device, non_blocking=True)
                for step in run:
                    current = self._batch_step(step, current, params[step.k], n, device, timer)
            else:
                into = None
                if r == len(self.runs) - 1 or self.runs[r + 1][0].batched:
                    into = self._buffer(n, types[run[-1].k], device, pinned=device.type == "cpu" and then.type == "cuda")
                current = self._per_image(run, current, params, device, into, timer)
            k_in = run[-1].k
        if isinstance(current, list):
            current = self._stack(current, self.graph.output, pinned=deliver_on.type == "cuda")
        return as_stored(current, self.graph.output).to(deliver_on, non_blocking=True)

    def _buffer(self, n: int, image: ImageType, device: torch.device, pinned: bool) -> torch.Tensor:
        shape, dtype = batch_layout(image, n)
        if device.type == "cuda":
            return torch.empty(shape, dtype=dtype, device=device)
        return self.allocate(shape, dtype, pinned)

    def _stack(self, images: list[torch.Tensor], image: ImageType, pinned: bool) -> torch.Tensor:
        """The images as one batch, on the device they are on (pinned there for a copy to the GPU)."""
        device = images[0].device
        buffer = self._buffer(len(images), image, device, pinned=pinned and device.type == "cpu")
        for i, chw in enumerate(images):
            write_row(buffer, i, chw)
        return as_nchw(buffer, image)

    def _per_image(self, run: list[TorchStep], images, params: list[dict], device: torch.device,
                   into: torch.Tensor | None, timer: StageTimer):
        """Image by image through every step of ``run``; into the rows of ``into`` when given."""
        out = [] if into is None else None
        last = run[-1]
        writes = into is not None and getattr(last.stage, "writes_into", False)
        for i in range(len(images)):
            x = images[i].to(device) if images[i].device != device else images[i]
            for step in run:
                started = timer.start()
                p = per_sample(params[step.k], i)
                try:
                    if writes and step is last:
                        step.stage.torch(x, p, out=into[i])
                    else:
                        x = step.stage.torch(x, p)
                except Exception as exc:
                    exc.add_note(f"in image stage {step.stage.name!r} ({step.stage.describe()}), on image {i} of "
                                 f"the batch: {x.dtype} {tuple(x.shape)} on {x.device}")
                    raise
                timer.stop(step.stage.name, started)
            if into is None:
                out.append(x)
            elif not writes:
                started = timer.start()
                write_row(into, i, x)
                timer.stop(last.stage.name, started)
        return out if into is None else as_nchw(into, self.graph.types[last.k])

    def _batch_step(self, step: TorchStep, images: torch.Tensor, params: dict, n: int, device: torch.device,
                    timer: StageTimer):
        started = timer.start()
        try:
            out = step.stage.torch_batch(images, params)
        except Exception as exc:
            exc.add_note(f"in image stage {step.stage.name!r} ({step.stage.describe()}), on a batch of {n} images: "
                         f"{images.dtype} NCHW {tuple(images.shape)} on {images.device}")
            raise
        out = check_batch(step, out, n, self.graph.types[step.k], device)
        timer.stop(step.stage.name, started)
        return out


def _runs(steps: tuple[TorchStep, ...]) -> list[list[TorchStep]]:
    """Consecutive steps on the same device and mode."""
    runs: list[list[TorchStep]] = []
    for step in steps:
        if runs and (runs[-1][0].gpu, runs[-1][0].batched) == (step.gpu, step.batched):
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs
