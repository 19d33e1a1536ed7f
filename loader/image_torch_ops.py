"""The resize and normalize stages as torch ops, where they run outside DALI.

On the CPU, torch's antialiased bilinear kernel for uint8 channels-last images is several times faster than
DALI's CPU resize, and normalizing one sample while it is still in cache avoids two passes over the batch.
These are the same operations torchvision applies to tensors (``v2.Resize(antialias=True)``, ``Normalize``).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..pipelines.image import ImageOutput


@contextlib.contextmanager
def one_thread():
    """Per-sample ops are too small to split; splitting them over OpenMP threads that DALI's decoder threads
    are already using makes every op wait on a busy core (measured: 14x slower). Restored on exit, so the
    trainer's own torch thread count is unchanged."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def resize(hwc: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """uint8 HWC -> uint8 CHW (a channels-last view), antialiased bilinear."""
    return F.interpolate(hwc.permute(2, 0, 1).unsqueeze(0), size=(height, width), mode="bilinear",
                         antialias=True, align_corners=False)[0]


class Finish:
    """Flip, then either keep uint8 NHWC or convert to normalised float32 NCHW."""

    def __init__(self, output: ImageOutput, mean, std):
        self.output = output
        self._mean = torch.tensor([255.0 * m for m in mean]).view(3, 1, 1)
        self._inv_std = torch.tensor([1.0 / (255.0 * s) for s in std]).view(3, 1, 1)

    def layout(self, n: int, height: int, width: int) -> tuple[tuple[int, ...], torch.dtype]:
        if self.output is ImageOutput.UINT8_NHWC:
            return (n, height, width, 3), torch.uint8
        return (n, 3, height, width), torch.float32

    def allocate(self, n: int, height: int, width: int, *, pin: bool = False) -> torch.Tensor:
        shape, dtype = self.layout(n, height, width)
        return torch.empty(shape, dtype=dtype, pin_memory=pin)

    def into(self, out: torch.Tensor, i: int, chw: torch.Tensor, flip: bool) -> None:
        """Write one resized uint8 CHW sample into row ``i`` of a batch from ``allocate``."""
        if flip:
            chw = chw.flip(-1)
        if self.output is ImageOutput.UINT8_NHWC:
            torch.stack((chw[0], chw[1], chw[2]), dim=-1, out=out[i])  # the fastest CHW -> HWC copy for uint8
        else:
            row = out[i]
            row.copy_(chw)
            row.sub_(self._mean).mul_(self._inv_std)

    def batch(self, nhwc: torch.Tensor, flip: torch.Tensor | None) -> torch.Tensor:
        """The same for a whole uint8 NHWC batch on any device (the normalize stage placed on the GPU)."""
        if flip is not None and bool(flip.any()):
            nhwc = torch.where(flip.to(nhwc.device).view(-1, 1, 1, 1), nhwc.flip(2), nhwc)
        if self.output is ImageOutput.UINT8_NHWC:
            return nhwc
        out = nhwc.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        return out.sub_(self._mean.to(out.device)).mul_(self._inv_std.to(out.device))
