"""Opening an image source: listing an ImageFolder-style directory, a file list or an in-memory list once, in a
fixed order, and reading a sample's bytes by its index: its header from a bounded head of the file first, checked,
then the rest.

Every way a file can be bad (missing, a dangling link, not a regular file, empty, a bad header, too large) is a
DataError naming it, wherever it is met: reading a batch, or measuring samples for placement.
"""
from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import numpy as np

from ...pipelines.image_sources import IMAGE_EXTENSIONS, FileList, ImageFolder, ImageList
from ..errors import DataError
from .image_headers import (DEFAULT_MAX_PIXELS, HEAD_BYTES, Header, check_complete, encoded_limit, next_head,
                            read_header)


class OpenedSample:
    """A sample's bytes: ``length`` of them from ``start`` in the open file ``fd``."""

    __slots__ = ("fd", "start", "length", "where", "owned")

    def __init__(self, fd: int, start: int, length: int, where: str, owned: bool):
        self.fd, self.start, self.length, self.where, self.owned = fd, start, length, where, owned

    def read(self, at: int, n: int) -> np.ndarray:
        """Bytes ``at..at + n`` of the sample (uint8); a DataError where the file is shorter than that now."""
        data = np.empty(n, dtype=np.uint8)
        view, done = memoryview(data), 0
        try:
            while done < n:
                got = os.preadv(self.fd, [view[done:]], self.start + at + done)
                if got == 0:
                    raise DataError(self.where, self.shorter(at + done))
                done += got
        except OSError as exc:
            raise DataError(self.where, f"cannot be read: {exc.strerror or exc}") from None
        return data

    def shorter(self, ends: int) -> str:
        return (f"the file is shorter than when it was opened: it ends at byte {ends} of {self.length} "
                f"(changed or truncated while it was read)")

    def close(self) -> None:
        if self.owned:
            os.close(self.fd)


class ImageFiles:
    """Every sample's path and integer label (``labels`` None: the samples have no labels); ``origin`` is the
    directory or list it came from. Header sizes are read once per sample, when first needed, and kept."""

    def __init__(self, paths: tuple[str, ...], labels: np.ndarray | None, classes: tuple[str, ...], origin: str):
        self.paths = paths
        self.labels = labels  # int64, or None
        self.classes = classes
        self.origin = origin
        self._sizes = np.full((len(paths), 2), -1, dtype=np.int64)
        self._lengths = np.full(len(paths), -1, dtype=np.int64)  # encoded bytes of samples read so far
        self._header_errors: dict[int, DataError] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.paths)

    def where(self, index: int) -> str:
        return self.paths[index]

    def open_sample(self, index: int) -> OpenedSample:
        """Sample ``index``'s bytes, opened (a DataError names the file if they cannot be)."""
        path = self.paths[index]
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))  # a FIFO must not block
        except FileNotFoundError:
            if os.path.islink(path):
                raise DataError(path, f"a link to a missing file ({os.readlink(path)!r})") from None
            raise DataError(path, "file not found (deleted or moved after the dataset was listed)") from None
        except OSError as exc:
            raise DataError(path, f"cannot be read: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                raise DataError(path, "cannot be read: it is a directory, not an image file")
            if not stat.S_ISREG(st.st_mode):
                raise DataError(path, "cannot be read: not a regular file (a device, FIFO or socket)")
            if st.st_size == 0:
                raise DataError(path, "file is empty (0 bytes)")
        except BaseException:
            os.close(fd)
            raise
        return OpenedSample(fd, 0, st.st_size, path, owned=True)

    def read(self, index: int) -> np.ndarray:
        """The encoded bytes of sample ``index`` (uint8); a DataError names the file if they cannot be read."""
        opened = self.open_sample(index)
        try:
            data = opened.read(0, opened.length)
        finally:
            opened.close()
        self._lengths[index] = opened.length
        return data

    def read_checked(self, index: int, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[np.ndarray, np.ndarray]:
        """The encoded bytes and ``(width, height)`` (as decoded and oriented) of sample ``index``. The header is
        read from the first bytes of the file and checked (format, ``max_pixels``) before the rest is read, and
        the file's size against what such an image can hold; a bad header's error is kept, so the file is not
        opened again every time it comes round."""
        known = self._header_errors.get(index)
        if known is not None:
            raise known
        opened = self.open_sample(index)
        try:
            size = self._sizes[index]
            if size[0] >= 0:
                self._check_length(opened, int(size[0]) * int(size[1]))
                data = opened.read(0, opened.length)
            else:
                try:
                    data, header = self._read_with_header(opened, max_pixels)
                except DataError as error:
                    self._header_errors[index] = error
                    raise
                with self._lock:
                    size[:] = (header.width, header.height)
        finally:
            opened.close()
        self._lengths[index] = opened.length
        return data, size

    def _read_with_header(self, opened: OpenedSample, max_pixels: int) -> tuple[np.ndarray, Header]:
        where, length = opened.where, opened.length
        if length > encoded_limit(max_pixels):
            raise DataError(where, f"the file holds {length} bytes, more than an image of max_pixels={max_pixels} "
                                   f"pixels can (not read)")
        head = opened.read(0, min(HEAD_BYTES, length))
        while True:
            header = read_header(head.tobytes(), where, max_pixels, whole=head.size == length)
            if header is not None:
                break
            more = next_head(head.size, length, head[:16].tobytes())
            if more is None:
                raise DataError(where, f"corrupt image header: no header the decoder reads in the file's first "
                                       f"{head.size} bytes")
            head = np.concatenate([head, opened.read(head.size, more - head.size)])
        self._check_length(opened, header.pixels)
        data = head if head.size == length else np.concatenate([head, opened.read(head.size, length - head.size)])
        check_complete(data, header, where)
        return data, header

    @staticmethod
    def _check_length(opened: OpenedSample, pixels: int) -> None:
        if opened.length > encoded_limit(pixels):
            raise DataError(opened.where, f"the file holds {opened.length} bytes, far more than its header's "
                                          f"{pixels} pixels need (not read)")

    def size(self, index: int, data: np.ndarray, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
        """(width, height) as decoded and oriented, from the header of ``data``, the sample's whole bytes (read
        once, then kept)."""
        size = self._sizes[index]
        if size[0] < 0:
            known = self._header_errors.get(index)
            if known is not None:
                raise known
            header = read_header(data.tobytes(), self.where(index), max_pixels, whole=True)
            check_complete(data, header, self.where(index))
            with self._lock:
                size[:] = (header.width, header.height)
        return size

    def encoded_bytes(self, indices) -> float:
        """Mean encoded size of those of the given samples that were read (0 before any): a file that could not
        be read has no size, and is not opened again to measure it."""
        lengths = self._lengths[np.asarray(list(indices), dtype=np.int64)]
        lengths = lengths[lengths > 0]
        return float(lengths.mean()) if lengths.size else 0.0


def open_folder(source: ImageFolder) -> ImageFiles:
    return _from_folder(Path(source.root))


def open_list(source: FileList) -> ImageFiles:
    return _from_list(Path(source.path))


def open_image_list(source: ImageList) -> ImageFiles:
    """Paths (and labels) given in memory: nothing is read or listed until a sample is."""
    if source.labels is None:
        return ImageFiles(source.paths, None, (), str(source))
    labels = np.asarray(source.labels, dtype=np.int64)
    return ImageFiles(source.paths, labels, tuple(str(i) for i in range(int(labels.max()) + 1)), str(source))


def _from_folder(root: Path) -> ImageFiles:
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image directory {str(root)!r} has no class sub-folders; expected "
                         f"ImageFolder layout <root>/<class>/<image>")
    # Every real directory is listed once: a class folder by its class, any other by the first class that
    # reaches it. A link to a directory already listed (a loop, or another class's folder) adds nothing.
    listed = {_identity(os.path.join(root, name)) for name in classes}
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        for path in _walk(os.path.join(root, name), listed):
            paths.append(path)
            labels.append(label)
    if not paths:
        raise ValueError(f"image directory {str(root)!r} has class folders {classes[:5]}"
                         f"{'...' if len(classes) > 5 else ''} but no image files "
                         f"(extensions {', '.join(IMAGE_EXTENSIONS)})")
    return ImageFiles(tuple(paths), np.asarray(labels, dtype=np.int64), tuple(classes), str(root))


def _identity(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _walk(folder: str, listed: set[tuple[int, int]]):
    """The image files under ``folder`` in sorted order (a folder's files, then each sub-folder's, depth
    first), following links to directories not listed yet. A folder that cannot be listed is an error naming
    it: its images would otherwise be lost without a word."""
    stack = [(folder, False)]
    while stack:
        current, check = stack.pop()
        try:
            if check:
                identity = _identity(current)
                if identity in listed:
                    continue
                listed.add(identity)
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot list image folder {current!r}: {exc.strerror or exc}") from None
        subfolders = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows links; a dangling link is not a directory
            except OSError:
                is_dir = False
            if is_dir:
                subfolders.append(entry.path)
            elif entry.name.lower().endswith(IMAGE_EXTENSIONS):
                yield entry.path  # a file, a dangling link, anything else: reading it says what is wrong
        stack.extend((sub, True) for sub in reversed(subfolders))


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
