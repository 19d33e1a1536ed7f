"""Crop and resize geometry computed on the host from image sizes, identical to torchvision's arithmetic, so
every placement decodes exactly the same window of every image."""
from __future__ import annotations

import math

import numpy as np

ATTEMPTS = 10


def random_resized_crop(width: np.ndarray, height: np.ndarray, u: np.ndarray,
                        scale: tuple[float, float], ratio: tuple[float, float]) -> np.ndarray:
    """torchvision ``RandomResizedCrop.get_params`` for a batch: int32 [n, 4] of (x, y, w, h).

    ``u`` holds ``2 * ATTEMPTS + 2`` uniforms per sample: (area, log-ratio) per attempt, then (y, x).
    """
    width = np.asarray(width, dtype=np.float64)
    height = np.asarray(height, dtype=np.float64)
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    n = width.size
    out_w = np.zeros(n, dtype=np.int64)
    out_h = np.zeros(n, dtype=np.int64)
    found = np.zeros(n, dtype=bool)
    for k in range(ATTEMPTS):
        target = area * (scale[0] + (scale[1] - scale[0]) * u[:, 2 * k])
        aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, 2 * k + 1])
        w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
        h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
        ok = ~found & (w > 0) & (h > 0) & (w <= width) & (h <= height)
        out_w[ok], out_h[ok] = w[ok], h[ok]
        found |= ok
    if not found.all():
        fw, fh = _centre_fallback(width[~found], height[~found], ratio)
        out_w[~found], out_h[~found] = fw, fh
    y = np.floor(u[:, -2] * (height - out_h + 1)).astype(np.int64)
    x = np.floor(u[:, -1] * (width - out_w + 1)).astype(np.int64)
    centre = ~found
    y[centre] = ((height[centre] - out_h[centre]) // 2).astype(np.int64)
    x[centre] = ((width[centre] - out_w[centre]) // 2).astype(np.int64)
    return np.stack([x, y, out_w, out_h], axis=1).astype(np.int32)


def _centre_fallback(width: np.ndarray, height: np.ndarray, ratio: tuple[float, float]):
    in_ratio = width / height
    w = width.copy()
    h = height.copy()
    narrow = in_ratio < min(ratio)
    wide = in_ratio > max(ratio)
    h[narrow] = np.rint(w[narrow] / min(ratio))
    w[wide] = np.rint(h[wide] * max(ratio))
    return w.astype(np.int64), h.astype(np.int64)


def resize_shorter(width: np.ndarray, height: np.ndarray, shorter: int) -> np.ndarray:
    """torchvision ``Resize(shorter)``: int32 [n, 2] of (new_w, new_h); the longer side is truncated."""
    width = np.asarray(width, dtype=np.int64)
    height = np.asarray(height, dtype=np.int64)
    wide = width >= height
    new_w = np.where(wide, (shorter * width) // height, shorter)
    new_h = np.where(wide, shorter, (shorter * height) // width)
    return np.stack([new_w, new_h], axis=1).astype(np.int32)


def centre_crop_anchor(width: np.ndarray, height: np.ndarray, size: int) -> np.ndarray:
    """torchvision ``CenterCrop(size)``: int32 [n, 2] of the (x, y) top-left corner."""
    x = np.rint((np.asarray(width, dtype=np.float64) - size) / 2.0)
    y = np.rint((np.asarray(height, dtype=np.float64) - size) / 2.0)
    return np.stack([x, y], axis=1).astype(np.int32)
