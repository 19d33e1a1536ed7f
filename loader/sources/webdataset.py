"""Opening webdataset tar shards: every shard indexed once (member names, data offsets and sizes, the text of its
``.cls`` labels), the index cached beside the shard, and each sample's image read with one ``os.pread`` of its
member's bytes.

The index of ``dir/train-0003.tar`` is ``dir/.train-0003.tar.feedline-idx`` (a hidden file, so a glob such as
``dir/*`` never takes it for a shard), JSON::

    {"format": "feedline-webdataset-index", "version": 1,
     "shard_size": <bytes>, "shard_mtime_ns": <st_mtime_ns>,
     "members": [[name, data_offset, size], [name, data_offset, size, "<text of a .cls member>"], ...],
     "end": null | "<why the scan stopped before the end of the archive>"}

``members`` lists the regular files in archive order; a ``.cls`` member of at most 64 bytes that lies inside the
file carries its text (latin-1, so any bytes survive). The index is used only while the shard's size and
modification time are the ones it records; otherwise the shard is scanned again. Where the folder cannot be
written, the index is kept in memory for this process (one warning per folder).

Problems found while indexing (a member without its ``.cls``, a ``.cls`` without an image, a label that is not a
non-negative integer, a member whose data lies past the end of a truncated shard) belong to their sample: it keeps
its index and its ``read`` raises a DataError naming ``shard:member``, so the Loader's ``on_error`` raises or
skips it like any bad image file. A shard that holds no sample at all (empty, not a tar file, or cut before its
first sample), or whose archive stops early with every listed sample whole, is one such bad sample itself, named
by the shard's path.
"""
from __future__ import annotations

import json
import logging
import os
import re
import tarfile
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...pipelines.image_sources import IMAGE_EXTENSIONS, WebDataset
from ..errors import DataError
from .image_files import ImageFiles

log = logging.getLogger("feedline")

INDEX_FORMAT, INDEX_VERSION = "feedline-webdataset-index", 1
INDEX_SUFFIX = ".feedline-idx"
LABEL_EXTENSION = "cls"
IMAGE_MEMBER_EXTENSIONS = tuple(e[1:] for e in IMAGE_EXTENSIONS)  # jpg, jpeg, png, ...
MAX_LABEL_BYTES = 64
_INT64_MAX = (1 << 63) - 1
_ASCII_SPACE = " \t\n\r\x0b\x0c"
_DIGITS = re.compile(r"[0-9]+")
_GZIP_MAGIC = b"\x1f\x8b"
_SCAN_THREADS = 8
_IMAGE_NAMES = ", ".join(f".{e}" for e in IMAGE_MEMBER_EXTENSIONS)

_memory_lock = threading.Lock()
_memory: dict[tuple[str, int, int], ShardIndex] = {}  # indexes that could not be written beside their shard
_warned_folders: set[str] = set()


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: ``members`` as ``(name, data_offset, size, label_text | None)`` in archive order, and
    ``end``, why the scan stopped before a proper end of the archive (None when it did not)."""

    size: int
    mtime_ns: int
    members: tuple[tuple[str, int, int, str | None], ...]
    end: str | None


def index_path(shard: str) -> str:
    folder, name = os.path.split(shard)
    return os.path.join(folder, f".{name}{INDEX_SUFFIX}")


def shard_index(shard: str) -> ShardIndex:
    """The index of ``shard``: from the cache file beside it while it matches the shard's size and modification
    time, else from this process's memory, else scanned (and cached)."""
    stat = os.stat(shard)
    cached = _load(index_path(shard), stat)
    if cached is not None:
        return cached
    key = (os.path.realpath(shard), stat.st_size, stat.st_mtime_ns)
    with _memory_lock:
        cached = _memory.get(key)
    if cached is not None:
        return cached
    index = scan(shard, stat)
    try:
        _save(index_path(shard), index)
    except OSError as exc:
        with _memory_lock:
            _memory[key] = index
            folder = os.path.dirname(os.path.abspath(shard))
            first = folder not in _warned_folders
            _warned_folders.add(folder)
        if first:
            warnings.warn(f"feedline: cannot write the webdataset index {index_path(shard)!r} "
                          f"({exc.strerror or exc}); the indexes of shards in {folder!r} are kept in memory by "
                          f"this process only, and every new process scans those shards again",
                          RuntimeWarning, stacklevel=2)
    return index


def scan(shard: str, stat: os.stat_result | None = None) -> ShardIndex:
    """Lists ``shard``'s regular members with ``tarfile``, stopping cleanly where the archive ends early or turns
    invalid, then reads the text of its short ``.cls`` members."""
    stat = stat or os.stat(shard)
    size = stat.st_size
    members: list[tuple[str, int, int]] = []
    end = None
    try:
        archive = tarfile.open(shard, mode="r:")
    except tarfile.ReadError as exc:
        return ShardIndex(size, stat.st_mtime_ns, (), _unreadable(shard, size, exc))
    with archive:
        while True:
            try:
                member = archive.next()
            except tarfile.ReadError as exc:
                end = _stopped(members, size, exc)
                break
            if member is None:
                end = _end_of_archive(shard, archive.offset, size)
                break
            if member.isreg():
                members.append((member.name, member.offset_data, member.size))
    return ShardIndex(size, stat.st_mtime_ns, _with_labels(shard, members, size), end)


def _unreadable(shard: str, size: int, exc: Exception) -> str:
    if size == 0:
        return "the shard is empty (0 bytes)"
    with open(shard, "rb") as f:
        head = f.read(2)
    if head == _GZIP_MAGIC:
        return ("the shard is gzip-compressed; members are read by their offsets, so shards must be "
                "uncompressed .tar files")
    return f"not a tar file ({exc})"


def _stopped(members: list[tuple[str, int, int]], size: int, exc: Exception) -> str:
    if not members:
        return f"the tar archive is corrupt ({exc})"
    name, offset, length = members[-1]
    if offset + length > size:
        return (f"the shard is truncated: it ends at byte {size}, inside member {name!r} "
                f"(bytes {offset}..{offset + length})")
    return f"the shard is truncated: it ends at byte {size}, right after member {name!r} ({exc})"


def _end_of_archive(shard: str, at: int, size: int) -> str | None:
    """Why the members ended at byte ``at``: None for tar's end-of-archive block of zeros."""
    with open(shard, "rb") as f:
        f.seek(at)
        block = f.read(tarfile.BLOCKSIZE)
    if len(block) == tarfile.BLOCKSIZE and not block.strip(b"\0"):
        return None
    if not block:
        return (f"the shard is truncated: it ends at byte {size} without tar's end-of-archive blocks, so members "
                f"after that point are missing")
    if len(block) < tarfile.BLOCKSIZE:
        return f"the shard is truncated: it ends at byte {size}, inside the tar header that starts at byte {at}"
    return f"invalid tar header at byte {at}: the members from there on cannot be read"


def _with_labels(shard: str, members: list[tuple[str, int, int]], size: int
                 ) -> tuple[tuple[str, int, int, str | None], ...]:
    wanted = [k for k, (name, offset, length) in enumerate(members)
              if offset + length <= size and length <= MAX_LABEL_BYTES and _extension(name) == LABEL_EXTENSION]
    texts: dict[int, str] = {}
    if wanted:
        fd = os.open(shard, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            for k in wanted:
                _, offset, length = members[k]
                texts[k] = os.pread(fd, length, offset).decode("latin-1")
        finally:
            os.close(fd)
    return tuple((name, offset, length, texts.get(k)) for k, (name, offset, length) in enumerate(members))


def _load(path: str, stat: os.stat_result) -> ShardIndex | None:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if (doc.get("format") != INDEX_FORMAT or doc.get("version") != INDEX_VERSION
                or doc.get("shard_size") != stat.st_size or doc.get("shard_mtime_ns") != stat.st_mtime_ns):
            return None
        members = tuple((str(m[0]), int(m[1]), int(m[2]), None if len(m) < 4 else str(m[3]))
                        for m in doc["members"])
        end = doc.get("end")
        return ShardIndex(stat.st_size, stat.st_mtime_ns, members, None if end is None else str(end))
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # absent, unreadable or not ours: scan the shard again


def _save(path: str, index: ShardIndex) -> None:
    doc = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "shard_size": index.size,
           "shard_mtime_ns": index.mtime_ns,
           "members": [[n, o, s] if t is None else [n, o, s, t] for n, o, s, t in index.members],
           "end": index.end}
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # ranks may index the same shard at once
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _split(name: str) -> tuple[str, str] | None:
    """(key, extension) as webdataset splits a member name: at the first dot of its file name. None for names
    without an extension and hidden files, which belong to no sample."""
    base = name.rpartition("/")[2]
    dot = base.find(".")
    if dot <= 0:
        return None
    cut = len(name) - len(base) + dot
    return name[:cut], name[cut + 1:]


def _extension(name: str) -> str | None:
    split = _split(name)
    return None if split is None else split[1].lower()


class _Samples:
    """The samples of every shard, gathered in order into the columns ShardImages keeps."""

    def __init__(self) -> None:
        self.where: list[str] = []
        self.shard: list[int] = []
        self.offset: list[int] = []
        self.size: list[int] = []
        self.label: list[int] = []
        self.problems: dict[int, str] = {}
        self.placeholders = 0

    def add(self, where: str, shard: int, offset: int, size: int, label: int, problem: str | None) -> None:
        if problem is not None:
            self.problems[len(self.where)] = problem
        self.where.append(where)
        self.shard.append(shard)
        self.offset.append(offset)
        self.size.append(size)
        self.label.append(label if problem is None else -1)

    def add_shard(self, number: int, shard: str, index: ShardIndex) -> None:
        groups: list[tuple[str, list[tuple[str, str, int, int, str | None]]]] = []
        extensions: set[str] = set()
        for name, offset, length, text in index.members:
            split = _split(name)
            if split is None:
                continue
            key, ext = split
            extensions.add(ext)
            if not groups or groups[-1][0] != key:
                groups.append((key, []))
            groups[-1][1].append((name, ext.lower(), offset, length, text))
        samples = [(key, members) for key, members in groups
                   if any(ext in IMAGE_MEMBER_EXTENSIONS or ext == LABEL_EXTENSION for _, ext, *_ in members)]
        end_told = False
        for k, (key, members) in enumerate(samples):
            last = k == len(samples) - 1
            images = [m for m in members if m[1] in IMAGE_MEMBER_EXTENSIONS]
            labels = [m for m in members if m[1] == LABEL_EXTENSION]
            named = images[0] if images else labels[0]
            problem, label, truncated = _problem(key, images, labels, index.size)
            if problem is not None and index.end is not None and (last or truncated):
                if not truncated:  # e.g. its .cls was cut off with the rest of the shard
                    problem = f"{problem}; {index.end}"
                end_told = True
            offset, length = (images[0][2], images[0][3]) if images else (0, 0)
            self.add(f"{shard}:{named[0]}", number, offset, length, label, problem)
        if not samples:
            if index.end is not None:
                reason = index.end
            elif index.members:
                found = f" (its members' extensions: {', '.join(sorted(extensions))})" if extensions else ""
                reason = f"no member is an image ({_IMAGE_NAMES}) or a label (.cls){found}"
            else:
                reason = "the shard is a tar archive without members"
            self.add(shard, number, 0, 0, -1, f"no samples: {reason}")
            self.placeholders += 1
        elif index.end is not None and not end_told:
            self.add(shard, number, 0, 0, -1, index.end)
            self.placeholders += 1


def _problem(key: str, images: list, labels: list, shard_size: int) -> tuple[str | None, int, bool]:
    """What is wrong with one sample (None if nothing), its label, and whether a member is truncated."""
    for name, _, offset, length, _ in images + labels:
        if offset + length > shard_size:
            return (f"member {name!r} is truncated: its data needs bytes {offset}..{offset + length} but the "
                    f"shard ends at byte {shard_size}"), -1, True
    if not images:
        return (f"no image member for key {key!r} (found {', '.join(m[0] for m in labels)}); expected "
                f"{key}.jpg, {key}.jpeg or {key}.png"), -1, False
    if len(images) > 1:
        return f"more than one image member for key {key!r}: {', '.join(m[0] for m in images)}", -1, False
    if not labels:
        return f"no label member {key}.cls for this image", -1, False
    if len(labels) > 1:
        return f"more than one label member for key {key!r}: {', '.join(m[0] for m in labels)}", -1, False
    name, _, _, length, text = labels[0]
    if length > MAX_LABEL_BYTES:
        return (f"label member {name!r} holds {length} bytes; expected a non-negative integer as ASCII "
                f"text"), -1, False
    value = text.strip(_ASCII_SPACE) if text is not None else ""
    if not _DIGITS.fullmatch(value) or int(value) > _INT64_MAX:
        return f"label member {name!r} must hold a non-negative integer, got {text!r}", -1, False
    return None, int(value), False


class ShardImages(ImageFiles):
    """The samples of webdataset shards, read through the interface of :class:`ImageFiles`: ``paths[i]`` (and
    ``where(i)``) is ``shard:member`` (or the shard's path for a shard-level problem), ``read(i)`` the image
    member's bytes, read with one ``pread`` at its offset. ``shards`` are the shard files in order."""

    MAX_OPEN_SHARDS = 256  # beyond this many shards, each read opens and closes its shard

    def __init__(self, shards: tuple[str, ...], samples: _Samples, origin: str):
        labels = np.asarray(samples.label, dtype=np.int64)
        good = labels[labels >= 0]
        classes = tuple(str(i) for i in range(int(good.max()) + 1)) if good.size else ()
        super().__init__(tuple(samples.where), labels, classes, origin)
        self.shards = shards
        self._files = tuple(os.path.abspath(s) for s in shards)
        self._shard = np.asarray(samples.shard, dtype=np.int32)
        self._offset = np.asarray(samples.offset, dtype=np.int64)
        self._length = np.asarray(samples.size, dtype=np.int64)
        self._problems = samples.problems
        self._keep_open = len(shards) <= self.MAX_OPEN_SHARDS
        self._fds: dict[int, int] = {}
        self._fd_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_all, self._fds)

    @property
    def problems(self) -> dict[int, str]:
        """What indexing found wrong, by sample index (each raises from ``read``)."""
        return dict(self._problems)

    def read(self, index: int) -> np.ndarray:
        where = self.paths[index]
        problem = self._problems.get(index)
        if problem is not None:
            raise DataError(where, problem)
        offset, length = int(self._offset[index]), int(self._length[index])
        if length == 0:
            raise DataError(where, "image member is empty (0 bytes)")
        shard = int(self._shard[index])
        fd, owned = self._open(shard)
        try:
            data = np.empty(length, dtype=np.uint8)
            view, done = memoryview(data), 0
            while done < length:
                got = os.preadv(fd, [view[done:]], offset + done)
                if got == 0:
                    raise DataError(where, f"the shard is shorter than when it was indexed: the member needs bytes "
                                           f"{offset}..{offset + length}, the shard ends at byte {offset + done} "
                                           f"(changed or truncated after the dataset was listed)")
                done += got
            return data
        except OSError as exc:
            raise DataError(where, f"cannot be read: {exc.strerror or exc}") from None
        finally:
            if owned:
                os.close(fd)

    def _open(self, shard: int) -> tuple[int, bool]:
        """A descriptor of the shard, and whether the caller closes it."""
        if self._keep_open:
            with self._fd_lock:
                fd = self._fds.get(shard)
                if fd is None:
                    fd = self._fds[shard] = self._os_open(shard)
            return fd, False
        return self._os_open(shard), True

    def _os_open(self, shard: int) -> int:
        try:
            return os.open(self._files[shard], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            raise DataError(self.shards[shard], "shard not found (deleted or moved after the dataset was "
                                                "listed)") from None
        except OSError as exc:
            raise DataError(self.shards[shard], f"shard cannot be opened: {exc.strerror or exc}") from None

    def encoded_bytes(self, indices) -> float:
        """Mean size of the given samples' image members."""
        sizes = self._length[np.asarray(list(indices), dtype=np.int64)]
        sizes = sizes[sizes > 0]
        return float(sizes.mean()) if sizes.size else 0.0

    def close(self) -> None:
        """Closes the shards' descriptors (a later read opens them again)."""
        with self._fd_lock:
            _close_all(self._fds)


def _close_all(fds: dict[int, int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def open_webdataset(source: WebDataset) -> ShardImages:
    """Indexes (or finds the cached index of) every shard and numbers the samples shard by shard. Raises
    FileNotFoundError naming a missing shard or a pattern without matches, ValueError when no shard holds any
    sample."""
    shards = source.paths()
    if len(shards) > 1:
        with ThreadPoolExecutor(max_workers=min(_SCAN_THREADS, len(shards)),
                                thread_name_prefix="feedline-index") as pool:
            indexes = list(pool.map(_index_of, shards))
    else:
        indexes = [_index_of(shards[0])]
    samples = _Samples()
    for number, (shard, index) in enumerate(zip(shards, indexes)):
        samples.add_shard(number, shard, index)
    if samples.placeholders == len(samples.where):
        first = samples.problems[0]
        raise ValueError(f"webdataset {str(source)!r}: none of its {len(shards)} shard(s) holds a sample "
                         f"({shards[0]}: {first})")
    if samples.problems:
        k = min(samples.problems)
        log.warning("feedline: %d of the %d samples of %s are bad and raise or are skipped (on_error) when met; "
                    "first: %s: %s", len(samples.problems), len(samples.where), source, samples.where[k],
                    samples.problems[k])
    return ShardImages(shards, samples, str(source))


def _index_of(shard: str) -> ShardIndex:
    try:
        return shard_index(shard)
    except FileNotFoundError:
        raise FileNotFoundError(f"shard {shard!r} not found (deleted or moved while the dataset was "
                                f"opened)") from None
