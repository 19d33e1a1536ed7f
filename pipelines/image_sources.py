"""Where an image pipeline's samples come from, as declarations: a folder, a file list or webdataset tar shards,
listed (and checked) only when a Loader opens them, so a pipeline definition stays small and can be pickled."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .shard_patterns import is_shard_spec, shard_paths

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


@dataclass(frozen=True)
class WebDataset:
    """webdataset tar shards: a brace pattern (``"shards/train-{0000..0127}.tar"``), a glob (``"shards/*.tar"``),
    one ``.tar`` path, or a list of paths (see :mod:`feedline.pipelines.shard_patterns` for the expansion rules).
    A sample is the consecutive members sharing a key (the member name up to the first dot of its file name):
    one image ``<key>.jpg``, ``.jpeg`` or ``.png`` (or another of ``IMAGE_EXTENSIONS``) and ``<key>.cls``
    holding its integer label as ASCII text. Samples are numbered shard by shard, in the shards' order, then in
    member order within a shard. Shards must be uncompressed tar files: members are read by their offsets."""

    shards: str | tuple[str, ...]
    produces = ("file", "label")

    def __post_init__(self) -> None:
        shards = self.shards
        if isinstance(shards, os.PathLike):
            shards = os.fspath(shards)
        if isinstance(shards, (list, tuple)):
            items = []
            for k, path in enumerate(shards):
                path = os.fspath(path) if isinstance(path, os.PathLike) else path
                if not isinstance(path, str):
                    raise TypeError(f"WebDataset shards[{k}] must be a path (str or os.PathLike), "
                                    f"got {type(path).__name__}")
                items.append(path)
            if not items:
                raise ValueError("WebDataset shards: the list of shards is empty; give at least one .tar shard")
            shards = tuple(items)
        elif not isinstance(shards, str):
            raise TypeError(f"WebDataset shards must be a pattern or path (str) or a list of paths, "
                            f"got {type(shards).__name__}")
        elif not shards:
            raise ValueError("WebDataset shards must not be an empty string")
        object.__setattr__(self, "shards", shards)

    def paths(self) -> tuple[str, ...]:
        """The shard files, in order (FileNotFoundError naming a pattern without matches or a missing shard)."""
        return shard_paths(self.shards)

    def __str__(self) -> str:
        if isinstance(self.shards, str):
            return self.shards
        more = len(self.shards) - 1
        return self.shards[0] if not more else f"{self.shards[0]} (+{more} more shard{'s' if more > 1 else ''})"


ImageSource = ImageFolder | FileList | WebDataset


def image_source(data: str | os.PathLike | list | tuple | ImageSource) -> ImageSource:
    """What ``data`` names: an existing directory is an :class:`ImageFolder`; webdataset shards are a string
    with braces or glob characters, a path ending in ``.tar``, or a list or tuple of paths (a
    :class:`WebDataset`, whose shards must exist); any other existing file is a :class:`FileList`. A
    declaration is returned as is."""
    if isinstance(data, (ImageFolder, FileList, WebDataset)):
        return data
    if isinstance(data, (list, tuple)):
        source = WebDataset(tuple(data))
        source.paths()
        return source
    if not isinstance(data, (str, os.PathLike)):
        raise TypeError(f"data must be a path to an image directory, a file list or webdataset shards (a "
                        f"pattern, a .tar path or a list of paths), got {type(data).__name__}")
    text = os.fspath(data)
    if not isinstance(text, str):
        raise TypeError(f"data must be a str path, got {type(text).__name__}")
    path = Path(text)
    if path.is_dir():
        return ImageFolder(str(path))
    if path.is_file() and not text.endswith(".tar"):
        return FileList(str(path))  # an existing file is a list even where its name has glob characters
    if is_shard_spec(text):
        source = WebDataset(text)
        source.paths()
        return source
    raise FileNotFoundError(f"image data not found: {str(path)!r} does not exist")
