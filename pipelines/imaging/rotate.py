"""torchvision's ``RandomRotation(degrees)`` with ``expand=False``, ``center=None`` and ``fill=0``: an angle drawn
per sample, counter-clockwise about the image's centre, the same size, zeros where the source lies outside the
image. No DALI implementation: DALI's rotate uses another centre convention and sampling arithmetic, so it cannot
give torchvision's result."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from ..validate import one_of
from .base import ImageStage
from .checks import name as check_name
from .checks import number_range
from .types import Dtype, ImageType

INTERPOLATIONS = ("nearest", "bilinear")


def _exact_turn(image: torch.Tensor, angle: float) -> torch.Tensor | None:
    """The turns torchvision makes without resampling (``angle`` in [0, 360)), else None."""
    if angle == 0:
        return image
    if angle == 180:
        return image.rot90(2, (-2, -1))
    if angle in (90, 270) and image.shape[-1] == image.shape[-2]:
        return image.rot90(1 if angle == 90 else 3, (-2, -1))
    return None


def _pixel_centres(height: int, width: int, device: torch.device) -> torch.Tensor:
    """float32 ``[1, H * W, 3]``: each pixel's centre ``(x, y, 1)`` relative to the image's centre, made as
    torchvision makes it (``linspace``)."""
    points = torch.empty((1, height, width, 3), dtype=torch.float32, device=device)
    points[..., 0] = torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, width, device=device)
    points[..., 1] = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, height, device=device)[:, None]
    points[..., 2] = 1.0
    return points.view(1, height * width, 3)


def _grid(angle: float, points: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """grid_sample's float32 grid ``[1, H, W, 2]`` for a turn by ``angle`` degrees: the pixel centres times the
    inverse rotation divided by half the size, as one float32 ``bmm`` with torchvision's operands (its rounding
    decides ties of nearest sampling)."""
    turn = math.radians(-angle)
    cos, sin = math.cos(turn), math.sin(turn)
    inverse = torch.tensor([[[cos, sin, 0.0], [-sin, cos, 0.0]]], dtype=torch.float32, device=points.device)
    half = torch.tensor([0.5 * width, 0.5 * height], dtype=torch.float32, device=points.device)
    return points.bmm(inverse.transpose(1, 2).div_(half)).view(1, height, width, 2)


def rotate(images: torch.Tensor, angles: Sequence[float], interpolation: str = "nearest") -> torch.Tensor:
    """uint8 ``NCHW`` images, each turned by its angle in degrees (counter-clockwise); a new tensor in the
    input's memory layout."""
    out = torch.empty_like(images)
    height, width = images.shape[-2:]
    angles = [float(a) % 360 for a in angles]  # as torchvision: the matrix is made from the reduced angle
    resampled = []
    for i, angle in enumerate(angles):
        turned = _exact_turn(images[i], angle)
        if turned is None:
            resampled.append(i)
        else:
            out[i] = turned
    if not resampled:
        return out
    points = _pixel_centres(height, width, images.device)
    grid = torch.cat([_grid(angles[i], points, height, width) for i in resampled])
    every = len(resampled) == len(angles)
    index = None if every else torch.tensor(resampled, device=images.device)
    source = (images if every else images[index]).to(torch.float32)
    if interpolation == "nearest":
        # Sampled values are source pixels or the zero padding, which is fill 0: no mask needed.
        result = F.grid_sample(source, grid, mode="nearest", padding_mode="zeros", align_corners=False)
    else:
        # torchvision samples a channel of ones beside the image and multiplies by it (its way of filling with
        # 0), so pixels near the border are darkened by their share outside the image twice.
        ones = source.new_ones((source.shape[0], 1, height, width))
        sampled = F.grid_sample(torch.cat((source, ones), 1), grid, mode="bilinear", padding_mode="zeros",
                                align_corners=False)
        result = sampled[:, :-1].mul_(sampled[:, -1:]).round_()
    if every:
        out.copy_(result)  # exact integers: the copy to uint8 loses nothing
    else:
        out[index] = result.to(torch.uint8)
    return out


@dataclass(frozen=True)
class Rotate(ImageStage):
    """``degrees`` a number ``d >= 0`` (an angle in ``(-d, d)``) or a pair ``(min, max)``; ``interpolation``
    ``"nearest"`` (torchvision's default) or ``"bilinear"``."""

    degrees: float | tuple[float, float]
    name: str = "rotate"
    interpolation: str = "nearest"
    draws = 1

    def __post_init__(self) -> None:
        d = self.degrees
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            if not (math.isfinite(d) and d >= 0):
                raise ValueError(f"rotate: degrees as one number must be finite and >= 0, got {d!r}")
            object.__setattr__(self, "degrees", (-float(d), float(d)))
        else:
            object.__setattr__(self, "degrees", number_range("rotate", "degrees", d, low=None, high=None))
        one_of("rotate: interpolation", self.interpolation, INTERPOLATIONS)
        check_name("rotate", self.name)

    def output_type(self, image: ImageType) -> ImageType:
        if image.dtype is not Dtype.UINT8:
            raise TypeError(f"stage {self.name!r} rotates uint8 images, but its input is {image}; put it before "
                            f"normalize")
        return image

    def sample(self, u, sizes):
        lo, hi = self.degrees
        return {"angle": lo + (hi - lo) * u[:, 0]}, sizes

    def torch(self, image, p):
        return rotate(image.unsqueeze(0), [p["angle"]], self.interpolation)[0]

    def torch_batch(self, images, params):
        return rotate(images, params["angle"], self.interpolation)

    def describe(self) -> str:
        lo, hi = self.degrees
        return f"rotate by an angle in [{lo:g}, {hi:g}] degrees, {self.interpolation}"
