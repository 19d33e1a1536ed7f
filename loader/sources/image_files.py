"""Opening an image source: listing an ImageFolder-style directory or a file list once, in a fixed order, and
reading a sample's bytes and header size by its index."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

from ...pipelines.image_sources import IMAGE_EXTENSIONS, FileList, ImageFolder
from ..errors import DataError
from .image_headers import DEFAULT_MAX_PIXELS, displayed_size, read_bytes


class ImageFiles:
    """Every sample's path and integer label; ``origin`` is the directory or list file it came from. Header
    sizes are read once per sample, when first needed, and kept."""

    def __init__(self, paths: tuple[str, ...], labels: np.ndarray, classes: tuple[str, ...], origin: str):
        self.paths = paths
        self.labels = labels  # int64
        self.classes = classes
        self.origin = origin
        self._sizes = np.full((len(paths), 2), -1, dtype=np.int64)
        self._header_errors: dict[int, DataError] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.paths)

    def where(self, index: int) -> str:
        return self.paths[index]

    def read(self, index: int) -> np.ndarray:
        """The encoded bytes of sample ``index`` (uint8); a DataError names the file if they cannot be read."""
        return read_bytes(self.paths[index])

    def size(self, index: int, data: np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        """(width, height) as decoded and oriented, from the header of ``data`` (read once, then kept; a bad
        header's error is kept too, so the file is not parsed again every time it comes round)."""
        size = self._sizes[index]
        if size[0] < 0:
            known = self._header_errors.get(index)
            if known is not None:
                raise known
            try:
                w, h = displayed_size(data, self.where(index), max_pixels)
            except DataError as error:
                self._header_errors[index] = error
                raise
            with self._lock:
                size[:] = (w, h)
        return size

    def encoded_bytes(self, indices) -> float:
        """Mean size on disk of the given samples."""
        return float(np.mean([os.path.getsize(self.paths[i]) for i in indices]))

    def decoded_bytes(self) -> float:
        """Mean uint8 RGB bytes of the images whose headers were read so far (0 before any)."""
        known = self._sizes[self._sizes[:, 0] > 0]
        return float(known.prod(axis=1).mean() * 3) if known.size else 0.0


def open_folder(source: ImageFolder) -> ImageFiles:
    return _from_folder(Path(source.root))


def open_list(source: FileList) -> ImageFiles:
    return _from_list(Path(source.path))


def _from_folder(root: Path) -> ImageFiles:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image directory {str(root)!r} has no class sub-folders; expected "
                         f"ImageFolder layout <root>/<class>/<image>")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for dirpath, dirnames, filenames in os.walk(root / name, followlinks=True):
            dirnames.sort()
            for f in sorted(filenames):
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    paths.append(os.path.join(dirpath, f))
                    labels.append(label)
    if not paths:
        raise ValueError(f"image directory {str(root)!r} has class folders {classes[:5]}"
                         f"{'...' if len(classes) > 5 else ''} but no image files "
                         f"(extensions {', '.join(IMAGE_EXTENSIONS)})")
    return ImageFiles(tuple(paths), np.asarray(labels, dtype=np.int64), tuple(classes), str(root))


def _from_list(list_file: Path) -> ImageFiles:
    base = list_file.parent
    paths: list[str] = []
    labels: list[int] = []
    try:
        text = list_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"file list {str(list_file)!r} is not UTF-8 text; expected lines '<path> <label>' "
                         f"or a directory in ImageFolder layout") from None
    for lineno, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, label = line.rpartition(" ")
        if not sep or not name.strip():
            raise ValueError(f"{list_file}:{lineno}: expected '<path> <label>', got {line!r}")
        try:
            value = int(label)
        except ValueError:
            raise ValueError(f"{list_file}:{lineno}: label must be an integer, got {label!r}") from None
        if value < 0:
            raise ValueError(f"{list_file}:{lineno}: label must be >= 0, got {value}")
        p = Path(name.strip())
        paths.append(str(p if p.is_absolute() else base / p))
        labels.append(value)
    if not paths:
        raise ValueError(f"file list {str(list_file)!r} lists no images")
    num_classes = max(labels) + 1
    return ImageFiles(tuple(paths), np.asarray(labels, dtype=np.int64),
                      tuple(str(i) for i in range(num_classes)), str(list_file))
