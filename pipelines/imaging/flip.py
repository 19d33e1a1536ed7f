"""Random horizontal and vertical flips (torchvision's ``RandomHorizontalFlip`` / ``RandomVerticalFlip``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch

from .base import ImageStage
from .checks import name as check_name
from .checks import probability


@dataclass(frozen=True)
class _Flip(ImageStage):
    p: float = 0.5
    draws = 1
    has_dali = True
    _axis = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", probability(self.name, "p", self.p))
        check_name(self.name, self.name)

    def sample(self, u, sizes):
        return {"flip": u[:, 0] < self.p}, sizes

    def torch(self, image, p):
        return image.flip(self._axis) if p["flip"] else image

    def torch_batch(self, images, params):
        flip = params["flip"]
        if not flip.any():
            return images
        mask = torch.from_numpy(np.ascontiguousarray(flip)).to(images.device).view(-1, 1, 1, 1)
        return torch.where(mask, images.flip(self._axis), images)

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        from nvidia.dali import fn

        axis = {"horizontal": feeds["flip"]} if self._axis == -1 else {"vertical": feeds["flip"]}
        return fn.flip(node, device=device, **axis)

    def dali_feeds(self, params) -> dict:
        return {"flip": (params["flip"].astype(np.int32), "INT32", 0)}


@dataclass(frozen=True)
class HorizontalFlip(_Flip):
    name: str = "horizontal_flip"

    def describe(self) -> str:
        return f"flip left-right with probability {self.p:g}"


@dataclass(frozen=True)
class VerticalFlip(_Flip):
    name: str = "vertical_flip"
    _axis = -2

    def describe(self) -> str:
        return f"flip upside down with probability {self.p:g}"
