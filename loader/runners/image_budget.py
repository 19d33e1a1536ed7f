"""The decoded pixels an image batch may hold (``max_batch_pixels``), and which image is at fault when a batch
would hold more."""
from __future__ import annotations

from typing import Callable

from ..errors import DataError

PIXELS_PER_IMAGE = 1 << 24  # the default batch budget's share per image: 16.8 megapixels (48 MiB of RGB)


def default_batch_pixels(batch_size: int, max_pixels: int) -> int:
    """The decoded pixels a batch may hold when ``max_batch_pixels`` is not given: ``PIXELS_PER_IMAGE`` per
    image of the batch, and never less than one image of ``max_pixels``."""
    return max(batch_size * PIXELS_PER_IMAGE, max_pixels)


def _area(size) -> int:
    return int(size[0]) * int(size[1])


class PixelBudget:
    """``batch_pixels`` header pixels per batch of ``batch_size`` images; ``where(index)`` names a sample. An
    image above its share of the budget (``batch_pixels / batch_size``) is at fault only where its batch would
    pass the budget, and then the largest such image of the batch is; images within their share always fit
    together, so no ordinary image is ever blamed."""

    def __init__(self, batch_pixels: int, batch_size: int, where: Callable[[int], str]):
        self.batch_pixels = batch_pixels
        self.share = batch_pixels // batch_size
        self.where = where

    def blame(self, indices: list[int], sizes: list, pixels: int) -> tuple[int, DataError]:
        """Which of the images of a batch above the budget (``indices``, with their ``sizes`` of width and
        height, ``pixels`` in all) to leave out, and why."""
        k = max(range(len(sizes)), key=lambda j: _area(sizes[j]))
        w, h = int(sizes[k][0]), int(sizes[k][1])
        others = sorted((j for j in range(len(indices)) if j != k), key=lambda j: -_area(sizes[j]))
        named = ", ".join(f"{self.where(indices[j])} ({int(sizes[j][0])}x{int(sizes[j][1])})" for j in others[:3])
        return k, DataError(self.where(indices[k]),
                            f"its {w}x{h} pixels (above its share of {self.share} of the batch's budget) with those "
                            f"of the batch's {len(indices) - 1} other images (largest: {named or 'none'}) make "
                            f"{pixels} decoded pixels, above the batch's budget of {self.batch_pixels} "
                            f"(max_batch_pixels)")
