"""torchvision's ``RandomResizedCrop``: a random window of random area and aspect ratio, resized to a size."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .. import geometry
from .base import ImageStage, window_feeds
from .checks import name as check_name
from .checks import number_range, size_pair
from .crop import crop
from .resize import resize
from .types import ImageType


@dataclass(frozen=True)
class RandomResizedCrop(ImageStage):
    """The window follows ``RandomResizedCrop.get_params`` exactly (ten attempts, then the centre fallback);
    the resize is antialiased bilinear. ``size`` is an int or ``(height, width)``."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    name: str = "random_resized_crop"
    draws = 2 * geometry.ATTEMPTS + 2
    crops_first = True
    has_dali = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair("random_resized_crop", "size", self.size))
        object.__setattr__(self, "scale", number_range("random_resized_crop", "scale", self.scale,
                                                       low=0.0, high=1.0, open_low=True))
        object.__setattr__(self, "ratio", number_range("random_resized_crop", "ratio", self.ratio,
                                                       low=0.0, high=None, open_low=True))
        check_name("random_resized_crop", self.name)

    def output_type(self, image: ImageType) -> ImageType:
        return image.with_size(self.size)

    def sample(self, u, sizes):
        window = geometry.random_resized_crop(sizes[:, 0], sizes[:, 1], u, self.scale, self.ratio)
        out = np.tile(np.array([self.size[1], self.size[0]], dtype=np.int64), (sizes.shape[0], 1))
        return {"window": window}, out

    def torch(self, image, p):
        if "window" in p:
            x, y, w, h = (int(v) for v in p["window"])
            image = crop(image, x, y, w, h)
        return resize(image, *self.size)

    def torch_batch(self, images, params):
        if "window" in params:
            return super().torch_batch(images, params)
        return resize(images, *self.size)

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        from nvidia.dali import fn, types

        if "anchor" in feeds:
            node = fn.slice(node, feeds["anchor"], feeds["shape"], device=device, axis_names="WH")
        return fn.resize(node, device=device, resize_x=self.size[1], resize_y=self.size[0],
                         interp_type=types.INTERP_LINEAR, antialias=True)

    def dali_feeds(self, params) -> dict:
        return window_feeds(params)

    def describe(self) -> str:
        return f"random window (scale {self.scale}, ratio {tuple(round(r, 3) for r in self.ratio)}) to " \
               f"{self.size[0]}x{self.size[1]}"
