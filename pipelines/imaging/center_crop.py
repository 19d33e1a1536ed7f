"""torchvision's ``CenterCrop``: the centred window of a size, padded with zeros where the image is smaller."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .base import ImageStage
from .checks import name as check_name
from .checks import size_pair
from .crop import crop
from .types import ImageType


def centre_anchor(length: np.ndarray, crop_length: int) -> np.ndarray:
    """The window's first pixel along one axis, as torchvision: ``round((length - crop) / 2)`` (half to
    even) inside the image; where the image is shorter it is padded by ``(crop - length) // 2`` first."""
    length = np.asarray(length, dtype=np.int64)
    inside = np.rint((length - crop_length) / 2.0).astype(np.int64)
    return np.where(length >= crop_length, inside, -((crop_length - length) // 2))


@dataclass(frozen=True)
class CenterCrop(ImageStage):
    size: int | tuple[int, int]
    name: str = "center_crop"
    has_dali = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", size_pair("center_crop", "size", self.size))
        check_name("center_crop", self.name)

    def output_type(self, image: ImageType) -> ImageType:
        return image.with_size(self.size)

    def sample(self, u, sizes):
        h, w = self.size
        window = np.stack([centre_anchor(sizes[:, 0], w), centre_anchor(sizes[:, 1], h),
                           np.full(sizes.shape[0], w), np.full(sizes.shape[0], h)], axis=1).astype(np.int32)
        out = np.tile(np.array([w, h], dtype=np.int64), (sizes.shape[0], 1))
        return {"window": window}, out

    def torch(self, image, p):
        if "window" not in p:
            return image
        x, y, w, h = (int(v) for v in p["window"])
        return crop(image, x, y, w, h)

    def torch_batch(self, images, params):
        if "window" not in params:
            return images
        x, y, w, h = (int(v) for v in params["window"][0])  # one input size, so one window
        return crop(images, x, y, w, h)

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        from nvidia.dali import fn, types

        if "anchor" not in feeds:
            return node
        return fn.slice(node, feeds["anchor"], types.Constant([self.size[1], self.size[0]]), device=device,
                        axis_names="WH", out_of_bounds_policy="pad", fill_values=0)

    def dali_feeds(self, params) -> dict:
        if "window" not in params:
            return {}
        return {"anchor": (params["window"][:, :2].copy(), "INT32", 1)}

    def describe(self) -> str:
        return f"centre crop {self.size[0]}x{self.size[1]}"
