"""The type of the images between two stages, inferred before any data flows."""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Dtype(enum.Enum):
    UINT8 = "uint8"
    FLOAT32 = "float32"


@dataclass(frozen=True)
class ImageType:
    """``size`` is ``(height, width)`` when every image has it and None where sizes vary (after decoding, or a
    resize of the shorter side). uint8 images are laid out ``HWC`` (as decoded, and as delivered: NHWC);
    float32 images ``CHW`` (delivered NCHW). Stages see a torch image as ``CHW`` either way (torchvision's
    convention); a uint8 one is a channels-last view."""

    dtype: Dtype
    channels: int = 3
    size: tuple[int, int] | None = None

    @property
    def layout(self) -> str:
        return "HWC" if self.dtype is Dtype.UINT8 else "CHW"

    def with_size(self, size: tuple[int, int] | None) -> ImageType:
        return replace(self, size=size)

    def __str__(self) -> str:
        size = "varying size" if self.size is None else f"{self.size[0]}x{self.size[1]}"
        return f"{self.dtype.value} {self.layout} {self.channels} channels, {size}"


DECODED = ImageType(Dtype.UINT8, 3, None)
