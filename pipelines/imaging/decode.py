"""Decoding encoded images to uint8 RGB, in full or only the window the next stage crops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..validate import flag
from .base import ImageStage, window_feeds
from .checks import name as check_name
from .types import DECODED, ImageType


@dataclass(frozen=True)
class Decode(ImageStage):
    """uint8 RGB ``HWC`` images, EXIF orientation applied; grayscale, CMYK and PNG decode to RGB too.

    ``roi=True`` decodes only the window that the next stage starts by cropping (region-of-interest decoding,
    as DALI's ``decoders.image_slice``): the same pixels as decoding all and cropping, for less work. On the
    GPU, DALI decodes with nvJPEG (its ``mixed`` device)."""

    roi: bool = False
    name: str = "decode"
    consumes = ("encoded",)
    has_dali = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "roi", flag("decode: roi", self.roi))
        check_name("decode", self.name)

    def output_type(self, image: ImageType | None) -> ImageType:
        return DECODED

    def dali(self, node, feeds: Mapping[str, Any], device: str):
        from nvidia.dali import fn, types

        decoder = "mixed" if device == "gpu" else "cpu"
        if "anchor" in feeds:
            return fn.decoders.image_slice(node, feeds["anchor"], feeds["shape"], device=decoder,
                                           output_type=types.RGB, axis_names="WH")
        return fn.decoders.image(node, device=decoder, output_type=types.RGB)

    def dali_decoded(self, node, feeds: Mapping[str, Any], device: str):
        """What ``dali`` makes, from images already decoded (a cache of decoded images): the window cut out
        where the decoder would decode only it. ``feeds``' anchor and shape are ``(x, y)`` and ``(w, h)``."""
        from nvidia.dali import fn

        if device == "gpu":
            node = node.gpu()
        if "anchor" in feeds:
            return fn.slice(node, feeds["anchor"], feeds["shape"], axes=[1, 0], device=device)
        return node

    def dali_feeds(self, params) -> dict:
        return window_feeds(params)

    def describe(self) -> str:
        return "decode the crop window only" if self.roi else "decode"
