"""Image classification pipelines: ``train`` and ``val``, as declared stages over an image source.

Crop windows, flips and resize sizes are computed on the host from each image's header with a
counter-based random stream (see ``counter_rng``), so they are the same for every placement; the decoder
reads only the crop window (region-of-interest decoding) where the format allows.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from .choices import parse_enum
from .image_files import image_files
from .spec import PipelineSpec
from .stage import Backend, Stage

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BOTH = frozenset({Backend.CPU, Backend.GPU})
CPU_ONLY = frozenset({Backend.CPU})


class ImageOutput(enum.Enum):
    """FLOAT_NCHW: float32, normalised with mean/std (torchvision's ToTensor + Normalize).
    UINT8_NHWC: uint8 pixels, normalisation left to the trainer's device (4x fewer bytes to move)."""

    FLOAT_NCHW = "float"
    UINT8_NHWC = "uint8"


@dataclass(frozen=True)
class Normalize:
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD


def train(data: str | os.PathLike, size: int = 224, *, scale: tuple[float, float] = (0.08, 1.0),
          ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_prob: float = 0.5,
          output: ImageOutput | str = ImageOutput.FLOAT_NCHW, normalize: Normalize = Normalize()) -> PipelineSpec:
    """Random resized crop (torchvision semantics, antialiased linear resize), horizontal flip, normalise."""
    size = _size("size", size)
    scale = _range("scale", scale, low=0.0, high=1.0)
    ratio = _range("ratio", ratio, low=0.0, high=None)
    if isinstance(flip_prob, bool) or not isinstance(flip_prob, (int, float)) or not 0.0 <= flip_prob <= 1.0:
        raise ValueError(f"flip_prob must be a number in [0, 1], got {flip_prob!r}")
    output = _output(output)
    _check_normalize(normalize)
    stages = (
        Stage("crop_window", ("encoded",), ("window", "flip"), CPU_ONLY,
              {"scale": scale, "ratio": ratio, "flip_prob": float(flip_prob)}),
        Stage("decode", ("encoded", "window"), ("decoded",), BOTH, {"roi": True}),
        Stage("resize", ("decoded",), ("resized",), BOTH, {"size": (size, size)}),
        Stage("normalize", ("resized", "flip"), ("image",), BOTH,
              {"output": output, "mean": normalize.mean, "std": normalize.std}),
    )
    return PipelineSpec("image-train", image_files(data), stages, ("image", "label"))


def val(data: str | os.PathLike, size: int = 224, *, resize_size: int | None = None,
        output: ImageOutput | str = ImageOutput.FLOAT_NCHW, normalize: Normalize = Normalize()) -> PipelineSpec:
    """Resize the shorter side to ``resize_size`` (default ``round(size * 256 / 224)``), centre crop, normalise."""
    size = _size("size", size)
    resize_size = round(size * 256 / 224) if resize_size is None else _size("resize_size", resize_size)
    if resize_size < size:
        raise ValueError(f"resize_size ({resize_size}) must be >= size ({size}) for a centre crop")
    output = _output(output)
    _check_normalize(normalize)
    stages = (
        Stage("geometry", ("encoded",), ("resize_to", "crop_at"), CPU_ONLY, {"resize_size": resize_size, "size": size}),
        Stage("decode", ("encoded",), ("decoded",), BOTH, {"roi": False}),
        Stage("resize", ("decoded", "resize_to"), ("resized",), BOTH, {"shorter": resize_size}),
        Stage("normalize", ("resized", "crop_at"), ("image",), BOTH,
              {"output": output, "mean": normalize.mean, "std": normalize.std, "crop": (size, size)}),
    )
    return PipelineSpec("image-val", image_files(data), stages, ("image", "label"))


def _size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 8 <= value <= 8192:
        raise ValueError(f"{name} must be an integer number of pixels in [8, 8192], got {value!r}")
    return value


def _range(name: str, value: object, low: float, high: float | None) -> tuple[float, float]:
    ok = isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if ok:
        a, b = float(value[0]), float(value[1])
        ok = low < a <= b and (high is None or b <= high)
    if not ok:
        bound = f"({low}, {high}]" if high is not None else f"> {low}"
        raise ValueError(f"{name} must be a pair (min, max) with min <= max, both {bound}, got {value!r}")
    return a, b


def _output(value: ImageOutput | str) -> ImageOutput:
    return parse_enum(ImageOutput, "output", value)


def _check_normalize(normalize: Normalize) -> None:
    if not isinstance(normalize, Normalize):
        raise TypeError(f"normalize must be a feedline.pipelines.image.Normalize, got {type(normalize).__name__}")
    if len(normalize.mean) != 3 or len(normalize.std) != 3 or any(s <= 0 for s in normalize.std):
        raise ValueError(f"normalize needs 3 means and 3 positive stds, got {normalize}")
