"""Cropping one image to a window that may reach past its edges (filled with zeros, as torchvision pads)."""
from __future__ import annotations

import torch


def crop(image: torch.Tensor, x: int, y: int, w: int, h: int) -> torch.Tensor:
    """``image[..., y:y+h, x:x+w]`` of a ``CHW`` image; a view where the window lies inside it."""
    height, width = image.shape[-2], image.shape[-1]
    if x >= 0 and y >= 0 and x + w <= width and y + h <= height:
        return image[..., y:y + h, x:x + w]
    out = image.new_zeros((*image.shape[:-2], h, w))
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + w, width), min(y + h, height)
    if x1 > x0 and y1 > y0:
        out[..., y0 - y:y1 - y, x0 - x:x1 - x] = image[..., y0:y1, x0:x1]
    return out
