"""A generator of bad and awkward image files, one per case, for the on_error tests."""
from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from conftest import _photo_like

# case -> (what a good loader does: "bad" is left out with its reason, "good" decodes to RGB)
CASES = {
    "truncated": "bad",
    "zero_bytes": "bad",
    "text": "bad",
    "gif": "bad",
    "huge_header": "bad",
    "png_named_jpg": "good",
    "cmyk": "good",
    "grayscale": "good",
    "exif_rotated": "good",
}
REASONS = {
    "truncated": "corrupt or truncated",
    "zero_bytes": "empty",
    "text": "not an image",
    "gif": "GIF images are not supported",
    "huge_header": "60000x60000 pixels, above the limit",
    "deleted": "not found",
}


def _jpeg(pixels: np.ndarray, **save) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=92, **save)
    return out.getvalue()


def _with_size(jpeg: bytes, width: int, height: int) -> bytes:
    """The same JPEG with its frame header (SOF0) claiming another size."""
    at = jpeg.index(b"\xff\xc0")
    return jpeg[:at + 5] + struct.pack(">HH", height, width) + jpeg[at + 9:]


def payload(case: str, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = _photo_like(rng, 320, 240)
    if case == "truncated":
        return _jpeg(pixels)[:5000]
    if case == "zero_bytes":
        return b""
    if case == "text":
        return b"these are not the pixels you are looking for\n" * 20
    if case == "gif":
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="GIF")
        return out.getvalue()
    if case == "huge_header":
        return _with_size(_jpeg(pixels), 60000, 60000)
    if case == "png_named_jpg":
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        return out.getvalue()
    if case == "cmyk":
        out = io.BytesIO()
        Image.fromarray(pixels).convert("CMYK").save(out, format="JPEG", quality=95)
        return out.getvalue()
    if case == "grayscale":
        return _jpeg(pixels.mean(axis=2).astype(np.uint8))
    if case == "exif_rotated":
        exif = Image.Exif()
        exif[0x0112] = 6  # rotate 90 degrees clockwise to display
        return _jpeg(pixels, exif=exif.tobytes())
    raise ValueError(f"unknown case {case!r}")
