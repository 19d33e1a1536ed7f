"""Where an image pipeline's samples come from, as declarations: a folder or a file list, listed (and checked)
only when a Loader opens it, so a pipeline definition stays small and can be pickled."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class ImageFolder:
    """``root/<class>/<image>`` (torchvision's ImageFolder layout): classes are the sub-folders sorted by
    name, labelled 0, 1, ...; images are files with one of ``IMAGE_EXTENSIONS``, in sorted order."""

    root: str
    produces = ("file", "label")

    def __str__(self) -> str:
        return self.root


@dataclass(frozen=True)
class FileList:
    """A text file of ``<path> <label>`` lines (paths relative to the list's folder unless absolute; blank
    lines and lines starting with ``#`` are ignored)."""

    path: str
    produces = ("file", "label")

    def __str__(self) -> str:
        return self.path


ImageSource = ImageFolder | FileList


def image_source(data: str | os.PathLike | ImageSource) -> ImageSource:
    """A directory is an :class:`ImageFolder`, a file a :class:`FileList`; a declaration is returned as is."""
    if isinstance(data, (ImageFolder, FileList)):
        return data
    if not isinstance(data, (str, os.PathLike)):
        raise TypeError(f"data must be a path to an image directory or a file list, got {type(data).__name__}")
    path = Path(data)
    if not path.exists():
        raise FileNotFoundError(f"image data not found: {str(path)!r} does not exist")
    return ImageFolder(str(path)) if path.is_dir() else FileList(str(path))
