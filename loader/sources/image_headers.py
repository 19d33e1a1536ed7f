"""An image's format and displayed size (EXIF orientation applied, as DALI's decoder does) from the first bytes
of its file, checked before the rest is read, with errors that name the file.

Headers are opened with the image library's format readers directly, without ``Image.open`` and so without
changing its process-wide decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``): the limit here is feedline's
own ``max_pixels``, checked on the header's size before anything is decoded. Only the formats DALI decodes are
parsed; any other is only recognised, to say what it is.
"""
from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image

from ..errors import DataError

_ORIENTATION = 0x0112
_TRANSPOSED = {5, 6, 7, 8}
DECODABLE = frozenset({"JPEG", "PNG", "BMP", "TIFF", "JPEG2000", "WEBP", "PPM"})  # what DALI's decoders read
DEFAULT_MAX_PIXELS = 1 << 27  # 134 megapixels: far above any photo, far below what exhausts memory
HEAD_BYTES = 1 << 16          # read first; a header that needs more is read again from a larger head
MAX_HEAD_BYTES = 1 << 24      # a header that is not inside this many bytes is not one (TIFF: see below)
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # a TIFF's directory may lie anywhere in it


@dataclass(frozen=True)
class Header:
    fmt: str
    width: int   # as displayed (after EXIF orientation)
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def encoded_limit(pixels: int) -> int:
    """The most bytes a file of an image of ``pixels`` pixels can sensibly hold: 16 per pixel (uncompressed 16-bit
    RGBA is 8) and 64 MiB of metadata. A larger file is not read."""
    return 16 * pixels + (64 << 20)


def next_head(read: int, length: int, head: bytes) -> int | None:
    """How many bytes to read next when a header did not parse from the first ``read`` of ``length``, or None
    when reading more would not help."""
    if read >= length:
        return None
    if read < MAX_HEAD_BYTES:
        return min(length, read * 16)
    return length if head.startswith(_TIFF_MAGICS) else None


def read_header(head: bytes, path: str, max_pixels: int, whole: bool) -> Header | None:
    """The header in ``head``, the first bytes of a file (``whole``: all of it). None when ``head`` is too short
    to hold it (read more); a DataError names the file when the header is bad or above ``max_pixels``."""
    failed = None
    for fmt, factory in _formats(head, path):
        if fmt == "WEBP":  # its reader parses the whole file: the size is read here, the rest once it is whole
            size = _webp_size(head)
            if size is not None:
                return _checked(path, fmt, *size, 1, max_pixels)
            failed = failed or "not a WebP header the decoder reads"
            continue
        try:
            with factory(io.BytesIO(head), "") as im:
                width, height = im.size
                orientation = im.getexif().get(_ORIENTATION, 1) if fmt == "JPEG" else 1
        except Exception as exc:  # noqa: BLE001  (whatever a format reader raises on bad bytes, the file is at fault)
            failed = failed or str(exc) or type(exc).__name__
            continue
        return _checked(path, fmt, width, height, orientation, max_pixels)
    if not whole:
        return None
    raise DataError(path, f"corrupt image header: {failed}")


def _checked(path: str, fmt: str, width: int, height: int, orientation: int, max_pixels: int) -> Header:
    if width <= 0 or height <= 0:
        raise DataError(path, f"image header claims an empty image ({width}x{height})")
    if width * height > max_pixels:
        raise DataError(path, f"image header claims {width}x{height} pixels, above the limit of "
                              f"{max_pixels} pixels (max_pixels)")
    if orientation in _TRANSPOSED:
        width, height = height, width
    return Header(fmt, width, height)


_READERS: tuple[tuple[str, object, object], ...] | None = None
_OTHERS: tuple[tuple[str, object], ...] | None = None


def _readers():
    global _READERS, _OTHERS
    if _READERS is None:
        Image.init()  # registers every format reader, as Image.open does on its first miss
        _OTHERS = tuple((fmt, Image.OPEN[fmt][1]) for fmt in Image.ID if fmt not in DECODABLE)
        _READERS = tuple((fmt, *Image.OPEN[fmt]) for fmt in Image.ID if fmt in DECODABLE)
    return _READERS, _OTHERS


def _formats(head: bytes, path: str) -> list:
    """The (format, reader) pairs that recognise a file starting with ``head``, in the image library's order;
    a DataError where none is a format DALI decodes."""
    prefix = head[:16]
    readers, others = _readers()
    found = [(fmt, factory) for fmt, factory, accept in readers if _accepts(accept, prefix)]
    if found:
        return found
    for fmt, accept in others:
        if _accepts(accept, prefix):
            raise DataError(path, f"{fmt} images are not supported; the decoder reads "
                                  f"{', '.join(sorted(DECODABLE))} (whatever the file's extension)")
    raise DataError(path, "not an image (unrecognised format)")


def _accepts(accept, prefix: bytes) -> bool:
    try:
        answer = accept(prefix) if accept else False
    except Exception:  # noqa: BLE001  (a recogniser that chokes on these bytes does not recognise them)
        return False
    return answer is True or (answer and not isinstance(answer, str))


def _webp_size(head: bytes) -> tuple[int, int] | None:
    """(width, height) of a WebP file from its first chunk (lossy, lossless or extended)."""
    if len(head) < 30 or head[:4] != b"RIFF" or head[8:12] != b"WEBP":
        return None
    chunk = head[12:16]
    if chunk == b"VP8 " and head[23:26] == b"\x9d\x01\x2a":
        return int.from_bytes(head[26:28], "little") & 0x3FFF, int.from_bytes(head[28:30], "little") & 0x3FFF
    if chunk == b"VP8L" and head[20] == 0x2F:
        bits = int.from_bytes(head[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return int.from_bytes(head[24:27], "little") + 1, int.from_bytes(head[27:30], "little") + 1
    return None


def check_complete(data: np.ndarray, header: Header, path: str) -> None:
    """Reject a JPEG that ends before its scan data, a PNG cut before its end chunk, and a WebP shorter than
    its RIFF container or that the image library cannot parse. The header alone is whole in all of them, so
    the size reads fine, but DALI's CPU decoder crashes the process (SIGSEGV, DALI 2.4) on some of them instead
    of raising."""
    raw = data.tobytes()
    if header.fmt == "JPEG":
        where = _jpeg_scan_start(raw)
        if where is None or len(raw) - where < 2:
            raise DataError(path, "truncated JPEG: the file ends before its image data")
    elif header.fmt == "PNG" and not _png_complete(raw):
        raise DataError(path, "truncated PNG: the file ends before its last chunk")
    elif header.fmt == "WEBP":
        if int.from_bytes(raw[4:8], "little") + 8 > len(raw):
            raise DataError(path, "truncated WebP: the file is shorter than its RIFF container says")
        readers, _ = _readers()
        factory = next(f for fmt, f, _ in readers if fmt == "WEBP")
        try:
            with factory(io.BytesIO(raw), ""):
                pass
        except Exception as exc:  # noqa: BLE001
            raise DataError(path, f"corrupt image header: {exc or type(exc).__name__}") from None


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
