"""Resizing: the shorter side to a length, or to an exact (height, width); antialiased bilinear, as
torchvision's ``Resize(antialias=True)``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
import torch.nn.functional as F

from .. import geometry
from .base import ImageStage
from .checks import name as check_name
from .checks import size_pair
from .types import ImageType


def resize(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """A ``CHW`` (or ``NCHW``) image, antialiased bilinear; uint8 stays uint8 (rounded)."""
    batch = image if image.dim() == 4 else image.unsqueeze(0)
    out = F.interpolate(batch, size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return out if image.dim() == 4 else out[0]


@dataclass(frozen=True)
class Resize(ImageStage):
    """``size`` an int: the shorter side becomes ``size`` and the longer keeps the aspect ratio (truncated, as
    torchvision). ``size`` a pair ``(height, width)``: exactly that."""

    size: int | tuple[int, int]
    name: str = "resize"
    has_dali = True

    def __post_init__(self) -> None:
        if isinstance(self.size, int) and not isinstance(self.size, bool):
            size_pair("resize", "size", self.size)
        else:
            object.__setattr__(self, "size", size_pair("resize", "size", self.size))
        check_name("resize", self.name)

    @property
    def shorter(self) -> bool:
        return isinstance(self.size, int)

    def output_type(self, image: ImageType) -> ImageType:
        if not self.shorter:
            return image.with_size(self.size)
        if image.size is None:
            return image
        (w, h), = geometry.resize_shorter(np.array([image.size[1]]), np.array([image.size[0]]), self.size)
        return image.with_size((int(h), int(w)))

    def sample(self, u, sizes):
        if self.shorter:
            to = geometry.resize_shorter(sizes[:, 0], sizes[:, 1], self.size).astype(np.int64)
        else:
            to = np.tile(np.array([self.size[1], self.size[0]], dtype=np.int64), (sizes.shape[0], 1))
        return {"to": to}, to

    def torch(self, image, p):
        w, h = p["to"]
        return resize(image, int(h), int(w))

    def torch_batch(self, images, params):
        w, h = params["to"][0]
        return resize(images, int(h), int(w))

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        from nvidia.dali import fn, types

        if self.shorter:
            return fn.resize(node, device=device, resize_x=feeds["width"], resize_y=feeds["height"],
                             interp_type=types.INTERP_LINEAR, antialias=True)
        return fn.resize(node, device=device, resize_x=self.size[1], resize_y=self.size[0],
                         interp_type=types.INTERP_LINEAR, antialias=True)

    def dali_feeds(self, params) -> dict:
        if not self.shorter:
            return {}
        to = params["to"].astype(np.float32)
        return {"width": (to[:, 0].copy(), "FLOAT", 0), "height": (to[:, 1].copy(), "FLOAT", 0)}

    def describe(self) -> str:
        return f"resize shorter side to {self.size}" if self.shorter else f"resize to {self.size[0]}x{self.size[1]}"
