"""torchvision's ``ColorJitter``: brightness, contrast, saturation and hue factors drawn per sample, the four
adjustments applied in a random order per sample, each in torchvision's uint8 arithmetic. No DALI
implementation: DALI's color_twist and hsv use other formulas and a fixed order, so they cannot give
torchvision's result."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .base import ImageStage
from .checks import name as check_name
from .grayscale import check_uint8_rgb, luma
from .types import ImageType

ADJUSTMENTS = ("brightness", "contrast", "saturation", "hue")
_IDENTITY = (1.0, 1.0, 1.0, 0.0)  # the factor of each adjustment that leaves an image as it is


def _blend(image: torch.Tensor, other: torch.Tensor, ratio: float) -> torch.Tensor:
    """``ratio * image + (1 - ratio) * other``, clamped and truncated to uint8 (the second product fused into
    the sum, as torchvision computes it)."""
    return image.mul(ratio).add_(other, alpha=1.0 - ratio).clamp_(0, 255).to(torch.uint8)


def adjust_brightness(image: torch.Tensor, factor: float | torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 3, H, W]`` times ``factor`` (a number, or float32 broadcasting against the image)."""
    return image.mul(factor).clamp_(0, 255).to(torch.uint8)


def adjust_contrast(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Blended with the mean of its floored luma; one image ``CHW``."""
    mean = luma(image).floor_().mean(dim=(-3, -2, -1), keepdim=True)
    return _blend(image, mean, factor)


def adjust_saturation(image: torch.Tensor, factor: float) -> torch.Tensor:
    """Blended with its floored luma."""
    return _blend(image, luma(image).floor_(), factor)


def adjust_hue(image: torch.Tensor, factor: float | torch.Tensor) -> torch.Tensor:
    """The hue turned by ``factor`` (in turns) through HSV, with torchvision's float32 operations and rounding,
    back to uint8 by ``x * 255.999`` truncated. ``factor``: a number, or float32 ``[..., 1, 1]``."""
    red, green, blue = image.unbind(-3)
    # Maximum and minimum in uint8: scaling to [0, 1] keeps their order and equality.
    top = torch.maximum(torch.maximum(red, green), blue)
    least = torch.minimum(torch.minimum(red, green), blue)
    flat = top == least  # no hue, no saturation
    x = image.mul(1.0 / 255)
    high = top.mul(1.0 / 255)
    span = high - least.mul(1.0 / 255)
    saturation = span / torch.where(flat, 1.0, high)
    # Each channel's distance below the maximum, in units of the span.
    dr, dg, db = ((high.unsqueeze(-3) - x) / torch.where(flat, 1.0, span).unsqueeze(-3)).unbind(-3)
    sextant = torch.where(top == red, db - dg, torch.where(top == green, (dr + 2.0) - db, (dg + 4.0) - dr))
    hue = sextant.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0).add_(factor).remainder_(1.0)

    h6 = hue.mul_(6.0)
    sector = h6.floor()
    f = h6.sub_(sector)
    sf = saturation * f
    grey = 1.0 - saturation
    falling = (1.0 - sf).mul_(high).clamp_(0.0, 1.0)
    rising = sf.add_(grey).mul_(high).clamp_(0.0, 1.0)
    bottom = grey.mul_(high).clamp_(0.0, 1.0)
    values = torch.stack((high, bottom, falling, rising), dim=-3)
    # Sector s of the colour wheel takes channel c from values[(_CODES[c] >> 2 s) & 3].
    shift = sector.to(torch.int64).remainder_(6).mul_(2).unsqueeze(-3)
    pick = _codes(image.device).bitwise_right_shift(shift).bitwise_and_(3)
    out = torch.empty_like(image)
    out.copy_(values.gather(-3, pick).mul_(256.0 - 1e-3))  # the copy truncates to uint8
    return out


# Per output channel (r, g, b), the index into (v, p, q, t) of HSV for sectors 0..5, two bits each.
_SECTORS = ((0, 3, 1), (2, 0, 1), (1, 0, 3), (1, 2, 0), (3, 1, 0), (0, 1, 2))
_CODES = tuple(sum(row[c] << 2 * s for s, row in enumerate(_SECTORS)) for c in range(3))
_CODE_TENSORS: dict[torch.device, torch.Tensor] = {}


def _codes(device: torch.device) -> torch.Tensor:
    codes = _CODE_TENSORS.get(device)
    if codes is None:
        codes = _CODE_TENSORS[device] = torch.tensor(_CODES, dtype=torch.int64, device=device).view(3, 1, 1)
    return codes


_ADJUST = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def _factor_range(which: str, value: object) -> tuple[float, float]:
    """torchvision's ``ColorJitter._check_input``: a number ``d >= 0`` means ``[max(0, 1 - d), 1 + d]`` (hue:
    ``[-d, d]``, ``d <= 0.5``); a pair ``(min, max)`` is taken as it is, within the same bounds."""
    hue = which == "hue"
    low, high = (-0.5, 0.5) if hue else (0.0, math.inf)

    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    if number(value):
        if not 0.0 <= value <= high:
            raise ValueError(f"color_jitter: {which} as one number must be in [0, {high:g}], got {value!r}")
        return (-float(value), float(value)) if hue else (max(0.0, 1.0 - value), 1.0 + value)
    if not (isinstance(value, (tuple, list)) and len(value) == 2 and all(number(v) for v in value)):
        raise TypeError(f"color_jitter: {which} must be a number or a pair (min, max) of finite numbers, got "
                        f"{value!r}")
    lo, hi = float(value[0]), float(value[1])
    if not low <= lo <= hi <= high:
        raise ValueError(f"color_jitter: {which} as a pair (min, max) must have min <= max, both in "
                         f"[{low:g}, {high:g}], got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class ColorJitter(ImageStage):
    """Each argument a number or a ``(min, max)`` range of factors, as torchvision's; a range that is only the
    identity (the default 0) skips that adjustment."""

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0
    hue: float | tuple[float, float] = 0.0
    name: str = "color_jitter"
    draws = 8

    def __post_init__(self) -> None:
        for which in ADJUSTMENTS:
            object.__setattr__(self, which, _factor_range(which, getattr(self, which)))
        check_name("color_jitter", self.name)

    @property
    def ranges(self) -> tuple[tuple[float, float], ...]:
        return tuple(getattr(self, which) for which in ADJUSTMENTS)

    @property
    def applied(self) -> tuple[bool, ...]:
        """Per adjustment, whether it runs at all."""
        return tuple(r != (c, c) for r, c in zip(self.ranges, _IDENTITY))

    def output_type(self, image: ImageType) -> ImageType:
        check_uint8_rgb(self.name, image, "adjusts the colours")
        return image

    def sample(self, u, sizes):
        """``order``: int64 [n, 4], a uniformly random permutation of the adjustments (0 brightness,
        1 contrast, 2 saturation, 3 hue) per sample; ``factors``: float64 [n, 4], each uniform in its range
        (the identity where an adjustment is skipped)."""
        order = np.argsort(u[:, :4], axis=1, kind="stable").astype(np.int64)
        lo, hi = np.array(self.ranges).T
        factors = np.where(self.applied, lo + (hi - lo) * u[:, 4:8], _IDENTITY)
        return {"order": order, "factors": factors}, sizes

    def torch(self, image, p):
        applied = self.applied
        for k in p["order"]:
            if applied[k]:
                image = _ADJUST[k](image, float(p["factors"][k]))
        return image

    def torch_batch(self, images, params):
        """Step by step, the samples that take the same adjustment at a step together: brightness and hue at
        once with a factor per image; contrast and saturation per image (torchvision's blend takes its ratio
        as a scalar, and its mean is over one image)."""
        order, factors = params["order"], params["factors"]
        out, owned = images, False  # owned: ``out`` is a new tensor, whose rows may be overwritten
        for step in range(4):
            for k in np.flatnonzero(self.applied):
                rows = np.flatnonzero(order[:, step] == k)
                if rows.size == 0:
                    continue
                if k in (1, 2):
                    if not owned:
                        out, owned = out.clone(), True
                    for i in rows:
                        out[i] = _ADJUST[k](out[i], float(factors[i, k]))
                    continue
                shape = (-1, 1, 1, 1) if k == 0 else (-1, 1, 1)  # hue's factor is added to [N, H, W]
                f = torch.from_numpy(factors[rows, k]).to(images.device, torch.float32).view(shape)
                if rows.size == out.shape[0]:
                    out, owned = _ADJUST[k](out, f), True
                    continue
                if not owned:
                    out, owned = out.clone(), True
                index = torch.from_numpy(rows).to(images.device)
                out[index] = _ADJUST[k](out[index], f)
        return out

    def describe(self) -> str:
        parts = [f"{which} [{lo:g}, {hi:g}]" for which, (lo, hi), on in zip(ADJUSTMENTS, self.ranges, self.applied)
                 if on]
        return "jitter " + ", ".join(parts) + " in random order" if parts else "color jitter (no adjustment)"
