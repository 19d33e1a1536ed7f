"""Image sources: an ImageFolder-style directory or a file list with labels, listed once, in a fixed order."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


@dataclass(frozen=True, eq=False)
class ImageFiles:
    """Every sample's path and integer label; ``origin`` is the directory or list file it came from."""

    paths: tuple[str, ...]
    labels: np.ndarray  # int64
    classes: tuple[str, ...]
    origin: str
    produces = ("encoded", "label")

    def __len__(self) -> int:
        return len(self.paths)


def image_files(data: str | os.PathLike) -> ImageFiles:
    """List ``data``: a directory of class folders (ImageFolder layout), or a text file whose lines are
    ``<path> <label>`` (paths relative to the list file's folder unless absolute)."""
    if not isinstance(data, (str, os.PathLike)):
        raise TypeError(f"data must be a path to an image directory or a file list, got {type(data).__name__}")
    path = Path(data)
    if not path.exists():
        raise FileNotFoundError(f"image data not found: {str(path)!r} does not exist")
    if path.is_dir():
        return _from_folder(path)
    return _from_list(path)


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
