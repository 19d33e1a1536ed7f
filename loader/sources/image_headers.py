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
    if orientation in _TRANSPOSED:
        width, height = height, width
    return width, height
