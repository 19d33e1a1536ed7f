"""torchvision's ``RandomGrayscale(p)``: with probability ``p`` an RGB image becomes its luma, on all three
channels. No DALI implementation: DALI's colour-space conversion uses other weights and rounds, so it cannot
give torchvision's result."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import ImageStage
from .checks import name as check_name
from .checks import probability
from .types import Dtype, ImageType


def luma(image: torch.Tensor) -> torch.Tensor:
    """``0.2989 R + 0.587 G + 0.114 B`` of a uint8 ``[..., 3, H, W]`` image as float32 ``[..., 1, H, W]``,
    unrounded, in torchvision's float32 arithmetic (the last two terms as fused multiply-adds)."""
    r, g, b = image.unbind(-3)
    return r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).unsqueeze(-3)


def to_gray(image: torch.Tensor) -> torch.Tensor:
    """torchvision's ``rgb_to_grayscale(image, num_output_channels=3)`` for uint8 ``[..., 3, H, W]``: the luma
    truncated to uint8 on every channel, in the input's memory layout."""
    out = torch.empty_like(image)
    out.copy_(luma(image).to(torch.uint8).expand_as(image))
    return out


def check_uint8_rgb(stage: str, image: ImageType, does: str) -> None:
    if image.dtype is not Dtype.UINT8:
        raise TypeError(f"stage {stage!r} {does} of uint8 images, but its input is {image}; put it before "
                        f"normalize")
    if image.channels != 3:
        raise ValueError(f"stage {stage!r} {does} of RGB images (3 channels), but its input is {image}")


@dataclass(frozen=True)
class Grayscale(ImageStage):
    p: float = 1.0
    name: str = "grayscale"
    draws = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", probability("grayscale", "p", self.p))
        check_name("grayscale", self.name)

    def output_type(self, image: ImageType) -> ImageType:
        check_uint8_rgb(self.name, image, "takes the luma")
        return image

    def sample(self, u, sizes):
        return {"gray": u[:, 0] < self.p}, sizes

    def torch(self, image, p):
        return to_gray(image) if p["gray"] else image

    def torch_batch(self, images, params):
        gray = params["gray"]
        if gray.all():
            return to_gray(images)
        if not gray.any():
            return images
        rows = torch.from_numpy(np.flatnonzero(gray)).to(images.device)
        out = images.clone()
        out[rows] = to_gray(images[rows])
        return out

    def describe(self) -> str:
        return "to grayscale" if self.p == 1.0 else f"to grayscale with probability {self.p:g}"
