"""Where an image pipeline's samples come from, as declarations: a folder, a file list, webdataset tar shards or
images named in memory, listed (and checked) only when a Loader opens them, so a pipeline definition stays small
and can be pickled."""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .shard_patterns import is_shard_spec, shard_paths

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
_INT64_MAX = (1 << 63) - 1


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


@dataclass(frozen=True)
class ImageList:
    """Images named in memory: ``paths`` (image files, read when a batch needs them) and their integer
    ``labels``, or None for images without labels (inference, self-supervised training), whose batches then
    hold no ``label`` at all. Nothing is listed, checked or written when it is declared: a missing or bad file
    is a DataError naming it when it is read, raised or skipped (``on_error``) like any image file."""

    paths: tuple[str, ...]
    labels: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        paths = _path_items("ImageList paths", self.paths)
        object.__setattr__(self, "paths", paths)
        if self.labels is not None:
            labels = _label_items(self.labels)
            if len(labels) != len(paths):
                raise ValueError(f"ImageList: {len(paths)} paths but {len(labels)} labels; give one label per path")
            object.__setattr__(self, "labels", labels)

    @property
    def produces(self) -> tuple[str, ...]:
        return ("file", "label") if self.labels is not None else ("file",)

    def __str__(self) -> str:
        more = len(self.paths) - 1
        what = "labelled" if self.labels is not None else "unlabelled"
        return f"{len(self.paths)} {what} image{'s' if more else ''} from memory (first {self.paths[0]})"


ImageSource = ImageFolder | FileList | WebDataset | ImageList


def _path_items(what: str, items: object) -> tuple[str, ...]:
    if isinstance(items, np.ndarray) and items.ndim == 1:
        items = items.tolist()
    if isinstance(items, (str, bytes, os.PathLike)) or not isinstance(items, Sequence):
        raise TypeError(f"{what} must be a list or tuple of paths, got {type(items).__name__}")
    out = []
    for k, path in enumerate(items):
        path = os.fspath(path) if isinstance(path, os.PathLike) else path
        if not isinstance(path, str) or not path:
            raise TypeError(f"{what}[{k}] must be a non-empty path (str or os.PathLike), got {path!r}")
        out.append(path)
    if not out:
        raise ValueError(f"{what}: the list is empty; give at least one image")
    return tuple(out)


def _label_items(labels: object) -> tuple[int, ...]:
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__") or not hasattr(labels, "__iter__"):
        raise TypeError(f"ImageList labels must be a list, tuple or 1-D array of integers, got "
                        f"{type(labels).__name__}")
    out = []
    for k, label in enumerate(labels):
        if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
            raise TypeError(f"ImageList labels[{k}] must be an integer, got {type(label).__name__} {label!r}")
        if label < 0 or label > _INT64_MAX:
            raise ValueError(f"ImageList labels[{k}] must be a non-negative integer, got {int(label)}")
        out.append(int(label))
    return tuple(out)


def _kind_of(path: str) -> str | None:
    """"shard" or "image" by a path's extension; None where it says neither."""
    lower = path.lower()
    if lower.endswith(".tar"):
        return "shard"
    if lower.endswith(IMAGE_EXTENSIONS):
        return "image"
    return None


def _sniff(path: str) -> str:
    """"shard" or "image" by a file's first bytes: a tar header holds ``ustar`` at byte 257 (POSIX and GNU
    tar, and every writer webdataset uses); anything else is taken for an image, and checked when read."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except FileNotFoundError:
        raise FileNotFoundError(f"image data not found: {path!r} does not exist") from None
    return "shard" if head[257:262] == b"ustar" else "image"


def _paths_kind(paths: tuple[str, ...]) -> str:
    """Whether a list of paths names webdataset shards or image files: by their extensions, all alike; a path
    with neither kind of extension by the first bytes of the first such file."""
    kinds = {_kind_of(p) for p in paths}
    known = kinds - {None}
    if len(known) > 1:
        shard = next(p for p in paths if _kind_of(p) == "shard")
        picture = next(p for p in paths if _kind_of(p) == "image")
        raise ValueError(f"data mixes webdataset shards ({shard!r}) and image files ({picture!r}); give a list "
                         f"of .tar shards or a list of images")
    if known:
        return known.pop()
    return _sniff(paths[0])


def _is_pair(x: object) -> bool:
    """``(path, label)``."""
    return (isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], (str, os.PathLike))
            and isinstance(x[1], (int, np.integer)) and not isinstance(x[1], (bool, np.bool_)))


def _is_paths_and_labels(data: tuple | list) -> bool:
    """``(paths, labels)``: two sequences (the first of paths, the second of labels), not two pairs."""
    return (len(data) == 2 and not all(_is_pair(x) for x in data)
            and all(isinstance(x, (list, tuple, np.ndarray)) for x in data))


def image_source(data: str | os.PathLike | list | tuple | ImageSource) -> ImageSource:
    """What ``data`` names: an existing directory is an :class:`ImageFolder`; a string with braces or glob
    characters or a path ending in ``.tar`` names webdataset shards (:class:`WebDataset`, whose shards must
    exist); any other existing file is a :class:`FileList`. In memory: ``(paths, labels)`` (two sequences of
    the same length), a list of ``(path, label)`` pairs, or a list of paths, told apart by what the paths are:
    ``.tar`` files (or files whose first bytes are a tar header) are shards, image files an unlabelled
    :class:`ImageList`. Nothing is written anywhere to decide. A declaration is returned as is."""
    if isinstance(data, (ImageFolder, FileList, WebDataset, ImageList)):
        return data
    if isinstance(data, (list, tuple)):
        if not data:
            raise ValueError("data is an empty list; give image paths, (paths, labels) or webdataset shards")
        if _is_paths_and_labels(data):
            return ImageList(_path_items("paths", data[0]), data[1])
        if all(_is_pair(x) for x in data):
            return ImageList(_path_items("paths", [x[0] for x in data]), [x[1] for x in data])
        paths = _path_items("data", data)
        if _paths_kind(paths) == "image":
            return ImageList(paths)
        source = WebDataset(paths)
        source.paths()
        return source
    if not isinstance(data, (str, os.PathLike)):
        raise TypeError(f"data must be a path to an image directory, a file list or webdataset shards (a "
                        f"pattern, a .tar path or a list of paths), image paths with or without labels, got "
                        f"{type(data).__name__}")
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
