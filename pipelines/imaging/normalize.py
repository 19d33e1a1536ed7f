"""uint8 to float32 ``CHW``, normalised: ``(x / 255 - mean) / std`` per channel (torchvision's
``ToDtype(float32, scale=True)`` then ``Normalize(mean, std)``)."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .base import ImageStage
from .checks import name as check_name
from .types import Dtype, ImageType

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@functools.lru_cache(maxsize=32)
def _constants(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device):
    """``255 * mean`` and ``1 / (255 * std)`` as float32 [C, 1, 1]: computed as ``(x - 255 m) * (1 / (255 s))``,
    within one float32 rounding of torchvision's ``(x / 255 - m) / s``."""
    shift = torch.tensor([255.0 * m for m in mean]).view(-1, 1, 1).to(device)
    scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(-1, 1, 1).to(device)
    return shift, scale


@dataclass(frozen=True)
class Normalize(ImageStage):
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    name: str = "normalize"
    has_dali = True

    def __post_init__(self) -> None:
        for what in ("mean", "std"):
            value = getattr(self, what)
            ok = isinstance(value, (tuple, list)) and len(value) in (1, 3) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
            if not ok:
                raise ValueError(f"normalize: {what} must hold one finite number per channel (1 or 3), got {value!r}")
            object.__setattr__(self, what, tuple(float(v) for v in value))
        if len(self.mean) != len(self.std):
            raise ValueError(f"normalize: mean and std must have the same length, got {self.mean} and {self.std}")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"normalize: std must be positive, got {self.std}")
        check_name("normalize", self.name)

    def output_type(self, image: ImageType) -> ImageType:
        if image.dtype is not Dtype.UINT8:
            raise TypeError(f"stage {self.name!r} normalises uint8 images (scaling them by 1/255), but its input is "
                            f"{image}")
        if image.channels != len(self.mean):
            raise ValueError(f"stage {self.name!r} has {len(self.mean)} means and stds for {image.channels}-channel "
                             f"images")
        return ImageType(Dtype.FLOAT32, image.channels, image.size)

    def torch(self, image, p, out: torch.Tensor | None = None):
        shift, scale = _constants(self.mean, self.std, image.device)
        if out is None:
            out = torch.empty(image.shape, dtype=torch.float32, device=image.device)
        out.copy_(image)
        return out.sub_(shift).mul_(scale)

    def torch_batch(self, images, params):
        shift, scale = _constants(self.mean, self.std, images.device)
        out = images.to(torch.float32, memory_format=torch.contiguous_format)
        return out.sub_(shift).mul_(scale)

    writes_into = True  # ``torch`` can write its result into a given batch row

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        from nvidia.dali import fn, types

        return fn.crop_mirror_normalize(node, device=device, dtype=types.FLOAT, output_layout="CHW",
                                        mean=[255.0 * m for m in self.mean], std=[255.0 * s for s in self.std])

    def describe(self) -> str:
        return "to float32, normalised"
