"""Image pipelines composed from typed stages, and the two standard recipes ``train`` and ``val``.

```python
from feedline.pipelines import image

spec = image.pipeline("/data/train", [
    image.decode(roi=True),
    image.random_resized_crop(224),
    image.horizontal_flip(),
    image.color_jitter(brightness=0.4, contrast=0.4, saturation=0.4),
    image.normalize(),
])
```

Every stage's randomness is drawn on the host from a counter-based stream keyed by (seed, epoch, index), so a
sample gets the same crop, flip and jitter on every placement, batch size and shard, and after a resume.
"""
from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Callable, Sequence

from .choices import parse_enum
from .imaging.base import ImageStage
from .imaging.center_crop import CenterCrop
from .imaging.color_jitter import ColorJitter
from .imaging.custom import Custom
from .imaging.decode import Decode
from .imaging.flip import HorizontalFlip, VerticalFlip
from .imaging.grayscale import Grayscale
from .imaging.normalize import IMAGENET_MEAN, IMAGENET_STD, Normalize
from .imaging.random_resized_crop import RandomResizedCrop
from .imaging.resize import Resize
from .imaging.rotate import Rotate
from .imaging.types import Dtype, ImageType
from .on_error import OnError
from .image_sources import FileList, ImageFolder, ImageList, ImageSource, WebDataset, image_source
from .spec import PipelineSpec
from .stage import CPU_ONLY, PlainStage
from .validate import int_in

__all__ = ["pipeline", "train", "val", "decode", "random_resized_crop", "resize", "center_crop",
           "horizontal_flip", "vertical_flip", "color_jitter", "grayscale", "rotate", "normalize", "custom",
           "ImageOutput", "Normalization", "ImageFolder", "FileList", "WebDataset", "ImageList", "IMAGENET_MEAN",
           "IMAGENET_STD"]

OUTPUTS = ("image", "label")
class ReadImages(PlainStage):
    def describe(self) -> str:
        return "read file and header; draw every stage's parameters"


READ = ReadImages("read", ("file",), ("encoded",), CPU_ONLY)


def decode(roi: bool = False, *, name: str = "decode") -> Decode:
    """uint8 RGB; ``roi=True`` decodes only the window the next stage starts by cropping."""
    return Decode(roi, name)


def random_resized_crop(size: int | tuple[int, int], scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3), *,
                        name: str = "random_resized_crop") -> RandomResizedCrop:
    return RandomResizedCrop(size, scale, ratio, name)


def resize(size: int | tuple[int, int], *, name: str = "resize") -> Resize:
    """An int: the shorter side to ``size``; a pair: exactly ``(height, width)``."""
    return Resize(size, name)


def center_crop(size: int | tuple[int, int], *, name: str = "center_crop") -> CenterCrop:
    return CenterCrop(size, name)


def horizontal_flip(p: float = 0.5, *, name: str = "horizontal_flip") -> HorizontalFlip:
    return HorizontalFlip(p, name)


def vertical_flip(p: float = 0.5, *, name: str = "vertical_flip") -> VerticalFlip:
    return VerticalFlip(p, name)


def color_jitter(brightness: float | tuple[float, float] = 0.0, contrast: float | tuple[float, float] = 0.0,
                 saturation: float | tuple[float, float] = 0.0, hue: float | tuple[float, float] = 0.0, *,
                 name: str = "color_jitter") -> ColorJitter:
    """torchvision's ``ColorJitter``: each factor drawn per sample, the four adjustments in a random order."""
    return ColorJitter(brightness, contrast, saturation, hue, name)


def grayscale(p: float = 1.0, *, name: str = "grayscale") -> Grayscale:
    """torchvision's ``RandomGrayscale(p)``: with probability ``p`` the image becomes gray, kept as 3 channels."""
    return Grayscale(p, name)


def rotate(degrees: float | tuple[float, float], *, name: str = "rotate") -> Rotate:
    """torchvision's ``RandomRotation(degrees)``: an angle drawn per sample from ``(-d, d)`` or ``(min, max)``,
    counter-clockwise, nearest-neighbour, same size, zeros outside the image."""
    return Rotate(degrees, name)


def normalize(mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD, *,
              name: str = "normalize") -> Normalize:
    """uint8 to float32 ``CHW``: ``(x / 255 - mean) / std``. Without it a pipeline delivers uint8 ``NHWC``."""
    return Normalize(tuple(mean), tuple(std), name)


def custom(fn: Callable, *, backends: str | Sequence[str] = ("cpu", "gpu"), name: str = "custom",
           draws: int = 0, dtype=None, size: int | tuple[int, int] | None = None,
           deterministic: bool = False) -> Custom:
    """Your own function on a batch of torch tensors (see :class:`Custom`), placed like any other stage:
    ``fn(images)``, ``fn(images, u)`` with ``draws > 0``, and ``size=(height, width)`` of its input given to a
    function with a ``size`` parameter; checked now. ``dtype`` (``"float32"``, ``torch.float32``, ...) and
    ``size`` declare what it returns where it changes them. ``deterministic=True`` declares that it draws no
    randomness of its own (the same images give the same output), so a cache may keep what comes out of it."""
    return Custom(fn, backends, name, draws, dtype, size, deterministic)


def pipeline(data: str | os.PathLike | ImageSource, stages: Sequence[ImageStage], *,
             name: str = "image", on_error: OnError | str | None = None) -> PipelineSpec:
    """The pipeline that reads ``data`` (a folder, a file list, webdataset shards, image paths in memory with
    or without labels, or their declarations; see ``image_source``) and applies ``stages`` in order. The first
    stage decodes; the last must leave every image one size. Each batch holds ``image`` (uint8 ``NHWC``, or
    float32 ``NCHW`` after ``normalize``) and ``label`` (left out for images given without labels).
    ``on_error`` (``"raise"`` or ``"skip"``): what a bad image does, here or on the Loader (None: the Loader's,
    else raise); given in both places, they must agree."""
    source = image_source(data)
    stages = _named(_checked(stages))
    types = infer_types(stages)
    if types[-1].size is None:
        raise ValueError(f"pipeline {name!r}: its last stage {stages[-1].name!r} leaves images of varying sizes, "
                         f"which cannot form a batch; end with a stage that makes one size (random_resized_crop, "
                         f"resize((h, w)), center_crop)")
    outputs = OUTPUTS if "label" in source.produces else ("image",)  # images without labels: no label key
    return PipelineSpec(name, source, (READ, *stages), outputs, on_error=on_error)


def infer_types(stages: Sequence[ImageStage]) -> list[ImageType]:
    """The type each stage outputs, checking every stage's input on the way (the pure declaration step)."""
    types: list[ImageType] = []
    current = None
    for k, stage in enumerate(stages):
        if isinstance(stage, Decode) != (k == 0):
            raise ValueError(f"stage {stage.name!r}: an image pipeline decodes first and only once; "
                             f"start with image.decode()")
        if isinstance(stage, Decode) and stage.roi and (k + 1 >= len(stages) or not stages[k + 1].crops_first):
            after = stages[k + 1].name if k + 1 < len(stages) else "nothing"
            raise ValueError(f"stage {stage.name!r}: decode(roi=True) decodes the window the next stage crops, "
                             f"but it is followed by {after!r}, which does not start with a crop; use "
                             f"decode() or put random_resized_crop next")
        current = stage.output_type(current)
        types.append(current)
    return types


def _checked(stages) -> tuple[ImageStage, ...]:
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Sequence) or not stages:
        raise TypeError(f"stages must be a non-empty list of image stages (image.decode(), image.resize(...), ...), "
                        f"got {stages!r}")
    for s in stages:
        if not isinstance(s, ImageStage):
            raise TypeError(f"stages must hold image stages such as image.resize(256), got {type(s).__name__} {s!r}")
    return tuple(stages)


def _named(stages: tuple[ImageStage, ...]) -> tuple[ImageStage, ...]:
    """A name used twice gets ``_2``, ``_3`` ... on its later uses, so placements can name every stage."""
    from dataclasses import replace

    seen: dict[str, int] = {READ.name: 1}
    out = []
    for s in stages:
        count = seen.get(s.name, 0) + 1
        seen[s.name] = count
        out.append(s if count == 1 else replace(s, name=f"{s.name}_{count}"))
    return tuple(out)


class ImageOutput(enum.Enum):
    """FLOAT_NCHW: float32, normalised with mean/std (torchvision's ToTensor + Normalize).
    UINT8_NHWC: uint8 pixels, normalisation left to the trainer's device (4x fewer bytes to move)."""

    FLOAT_NCHW = "float"
    UINT8_NHWC = "uint8"


@dataclass(frozen=True)
class Normalization:
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD


def _tail(output: ImageOutput | str, normalization: Normalization) -> list[ImageStage]:
    if not isinstance(normalization, Normalization):
        raise TypeError(f"normalize must be a feedline.pipelines.image.Normalization, "
                        f"got {type(normalization).__name__}")
    if parse_enum(ImageOutput, "output", output) is ImageOutput.UINT8_NHWC:
        return []
    return [Normalize(normalization.mean, normalization.std)]


def train(data: str | os.PathLike | ImageSource, size: int = 224, *, scale: tuple[float, float] = (0.08, 1.0),
          ratio: tuple[float, float] = (3 / 4, 4 / 3), flip_prob: float = 0.5,
          output: ImageOutput | str = ImageOutput.FLOAT_NCHW,
          normalize: Normalization = Normalization(), on_error: OnError | str | None = None) -> PipelineSpec:
    """Random resized crop (decoding only its window), horizontal flip, normalise: torchvision's ImageNet
    training recipe. ``on_error`` as in :func:`pipeline`."""
    if isinstance(flip_prob, bool) or not isinstance(flip_prob, (int, float)) or not 0.0 <= flip_prob <= 1.0:
        raise ValueError(f"flip_prob must be a number in [0, 1], got {flip_prob!r}")
    return pipeline(data, [decode(roi=True), random_resized_crop(_size("size", size), scale, ratio),
                           horizontal_flip(flip_prob), *_tail(output, normalize)], name="image-train",
                    on_error=on_error)


def val(data: str | os.PathLike | ImageSource, size: int = 224, *, resize_size: int | None = None,
        output: ImageOutput | str = ImageOutput.FLOAT_NCHW,
        normalize: Normalization = Normalization(), on_error: OnError | str | None = None) -> PipelineSpec:
    """Resize the shorter side to ``resize_size`` (default ``round(size * 256 / 224)``), centre crop, normalise.
    A Loader reads it in listed order unless given ``shuffle=True``. ``on_error`` as in :func:`pipeline`."""
    size = _size("size", size)
    resize_size = round(size * 256 / 224) if resize_size is None else _size("resize_size", resize_size)
    if resize_size < size:
        raise ValueError(f"resize_size ({resize_size}) must be >= size ({size}) for a centre crop")
    spec = pipeline(data, [decode(), resize(resize_size), center_crop(size), *_tail(output, normalize)],
                    name="image-val", on_error=on_error)
    return dataclasses.replace(spec, default_shuffle=False)  # evaluation reads in listed order


def _size(name: str, value: object) -> int:
    return int_in(f"{name} (pixels)", value, 8, 8192)


__all__ += ["Dtype", "ImageType", "infer_types"]
