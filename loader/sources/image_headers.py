"""Reading an image file's bytes and its displayed size (EXIF orientation applied, as DALI's decoder does)
from the header alone, with errors that name the file."""
from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image

from ..errors import DataError

_ORIENTATION = 0x0112
_TRANSPOSED = {5, 6, 7, 8}
DECODABLE = frozenset({"JPEG", "PNG", "BMP", "TIFF", "JPEG2000", "WEBP", "PPM"})  # what DALI's decoders read
DEFAULT_MAX_PIXELS = 1 << 27  # 134 megapixels: far above any photo, far below what exhausts memory

Image.MAX_IMAGE_PIXELS = None  # the size limit below is ours, and configurable


def read_bytes(path: str) -> np.ndarray:
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        raise DataError(path, "file not found (deleted or moved after the dataset was listed)") from None
    except (IsADirectoryError, PermissionError, OSError) as exc:
        raise DataError(path, f"cannot be read: {exc.strerror or exc}") from None
    if data.size == 0:
        raise DataError(path, "file is empty (0 bytes)")
    return data


def displayed_size(data: np.ndarray, path: str, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """(width, height) as decoded and oriented."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data.tobytes())) as im:
                width, height = im.size
                fmt = im.format
                orientation = im.getexif().get(_ORIENTATION, 1) if fmt == "JPEG" else 1
    except Image.UnidentifiedImageError:
        raise DataError(path, "not an image (unrecognised format)") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise DataError(path, f"corrupt image header: {exc}") from None
    if fmt not in DECODABLE:
        raise DataError(path, f"{fmt} images are not supported; the decoder reads "
                              f"{', '.join(sorted(DECODABLE))} (whatever the file's extension)")
    if width <= 0 or height <= 0:
        raise DataError(path, f"image header claims an empty image ({width}x{height})")
    if width * height > max_pixels:
        raise DataError(path, f"image header claims {width}x{height} pixels, above the limit of "
                              f"{max_pixels} pixels (max_pixels)")
    _check_complete(data, fmt, path)
    if orientation in _TRANSPOSED:
        width, height = height, width
    return width, height


def _check_complete(data: np.ndarray, fmt: str, path: str) -> None:
    """Reject a JPEG that ends before its scan data, and a PNG cut before its end chunk. The header alone is
    whole in both, so the size reads fine, but DALI's CPU decoder crashes the process (SIGSEGV, DALI 2.4) on
    some of them instead of raising."""
    raw = data.tobytes()
    if fmt == "JPEG":
        where = _jpeg_scan_start(raw)
        if where is None or len(raw) - where < 2:
            raise DataError(path, "truncated JPEG: the file ends before its image data")
    elif fmt == "PNG" and not _png_complete(raw):
        raise DataError(path, "truncated PNG: the file ends before its last chunk")


def _jpeg_scan_start(raw: bytes) -> int | None:
    """Where the entropy-coded data of the first scan starts, or None if the file ends before it."""
    pos = 2  # after SOI
    while pos + 4 <= len(raw):
        if raw[pos] != 0xFF:
            return None
        while pos < len(raw) and raw[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= len(raw):
            return None
        marker = raw[pos]
        pos += 1
        if marker in _STANDALONE:
            continue
        if pos + 2 > len(raw):
            return None
        end = pos + int.from_bytes(raw[pos:pos + 2], "big")
        if end > len(raw):
            return None
        if marker == 0xDA:  # start of scan
            return end
        pos = end
    return None


_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})  # TEM, RSTn, SOI


def _png_complete(raw: bytes) -> bool:
    pos = 8  # after the signature
    while pos + 8 <= len(raw):
        length = int.from_bytes(raw[pos:pos + 4], "big")
        kind = raw[pos + 4:pos + 8]
        pos += 12 + length
        if pos > len(raw):
            return False
        if kind == b"IEND":
            return True
    return False
