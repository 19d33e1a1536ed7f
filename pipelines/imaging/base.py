"""What an image stage declares, and the implementations a runner may pick from.

A stage is declared once and run by whichever engine its placement gives it:

- ``output_type``: the pure step. From the input :class:`ImageType` it infers the output type (or raises,
  naming the stage), before any data flows; nothing is allocated.
- ``draws`` and ``sample``: its per-sample randomness. The host draws ``draws`` uniforms per sample from the
  counter-based stream keyed by (seed, epoch, index) and ``sample`` turns them, with each image's size, into
  the sample's parameters (a crop window, a flip, jitter factors). Parameters are therefore the same on every
  placement, for every batch size, and after a resume.
- ``torch``: the op on one ``CHW`` image, a torch tensor on the CPU or a GPU; ``torch_batch`` on a batch
  ``NCHW`` of images of one size (by default ``torch`` per image).
- ``dali``: the op as DALI nodes on the device given (None: the stage has no DALI implementation and runs as
  torch ops wherever it is placed), fed per batch with what ``dali_feeds`` returns.

Sizes are int64 arrays ``[n, 2]`` of ``(width, height)`` per sample (DALI's ``WH`` order); user-facing sizes
are ``(height, width)`` as in torchvision.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from ..stage import BOTH, Backend, Stage
from .types import ImageType

Params = Mapping[str, np.ndarray]  # name -> one row per sample
SampleParams = Mapping[str, Any]   # name -> this sample's row
Feeds = Mapping[str, tuple[np.ndarray, str, int]]  # name -> (one row per sample, DALI type name, ndim)


class ImageStage(Stage):
    consumes: tuple[str, ...] = ("image",)
    produces: tuple[str, ...] = ("image",)
    backends: frozenset[Backend] = BOTH
    draws: int = 0
    crops_first = False     # starts by cropping ``params['window']`` (int32 [n, 4] of x, y, w, h; always inside
                            # the image): a region-of-interest decoder may take that crop over
    needs_batch = False     # runs only on a whole batch (images of one size)

    def output_type(self, image: ImageType) -> ImageType:
        return image

    def sample(self, u: np.ndarray, sizes: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``u``: float64 [n, draws]; ``sizes``: int64 [n, 2] of (w, h) in. Returns (params, sizes out)."""
        return {}, sizes

    def torch(self, image: torch.Tensor, p: SampleParams) -> torch.Tensor:
        raise NotImplementedError(f"stage {self.name!r} has no per-image torch implementation")

    def torch_batch(self, images: torch.Tensor, params: Params) -> torch.Tensor:
        return torch.stack([self.torch(images[i], {k: v[i] for k, v in params.items()})
                            for i in range(images.shape[0])])

    has_dali = False

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        """DALI nodes for this stage on ``device`` ("cpu" or "gpu"); ``feeds`` holds the nodes of
        ``dali_feeds``. Called inside an active ``with pipeline:`` block."""
        raise NotImplementedError(f"stage {self.name!r} has no DALI implementation")

    def dali_feeds(self, params: Params) -> Feeds:
        return {}

    def describe(self) -> str:
        """One line for the placement table: what the stage does."""
        return self.name


def fixed_size(stage: str, image: ImageType, what: str) -> tuple[int, int]:
    if image.size is None:
        raise ValueError(f"stage {stage!r} {what}, but its input images vary in size; put it after a stage that "
                         f"makes one size (random_resized_crop, resize((h, w)), center_crop)")
    return image.size


def window_feeds(params: Params) -> Feeds:
    """The DALI feeds of a crop to ``params['window']`` (where there is one): its anchor (x, y) and shape (w, h),
    as a cropping stage and the region-of-interest decoder that takes its crop over both slice them."""
    if "window" not in params:
        return {}
    window = params["window"]
    return {"anchor": (window[:, :2].copy(), "INT32", 1), "shape": (window[:, 2:].copy(), "INT32", 1)}


def per_sample(params: Params, i: int) -> dict[str, Any]:
    return {k: v[i] for k, v in params.items()}
