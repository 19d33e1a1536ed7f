"""Opening webdataset tar shards: every shard indexed once (member names, data offsets and sizes, the text of its
``.cls`` labels), the index kept for the next run, and each sample's image read with one ``os.pread`` of its
member's bytes.

Indexing reads the tar headers with :mod:`.tar_headers`, which checks every field before using it (sizes,
checksums, pax records) and only moves forward, so a crafted shard ends its scan with a reason instead of
hanging it. The index is kept by :mod:`.index_store` (a hidden sidecar ``.<shard>.feedline-members`` beside the
shard, else ``FEEDLINE_INDEX_DIR``, else this process's memory) and used only while the shard's content
fingerprint is the one it was made from; every value read back is checked again (offsets and sizes inside the
shard and in archive order, names, label texts), and an index that fails a check is rebuilt. The payload::

    {"members": [[name, data_offset, size], [name, data_offset, size, "<text of a .cls member>"], ...],
     "end": null | "<why the scan stopped before the end of the archive>", "end_member": null | "<name>"}

``members`` lists the regular files in archive order; a ``.cls`` member of at most 64 bytes that lies inside the
file carries its text (latin-1, so any bytes survive). A file that holds no tar header at all is not indexed
into a sidecar (nothing is written beside a file that is not a shard).

Problems found while indexing (a member without its ``.cls``, a ``.cls`` without an image, a label that is not a
non-negative integer, a member whose data lies past the end of a truncated shard) belong to their sample: it keeps
its index and its ``read`` raises a DataError naming ``shard:member``, so the Loader's ``on_error`` raises or
skips it like any bad image file. A shard that holds no sample at all (empty, not a tar file, or cut before its
first sample), or whose archive stops early with every listed sample whole, is one such bad sample itself, named
by the shard's path, or by ``shard:member`` where a member's header was invalid.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...pipelines.image_sources import IMAGE_EXTENSIONS, WebDataset
from ..errors import DataError
from . import index_store
from .image_files import ImageFiles, OpenedSample
from .tar_headers import BLOCK, list_members

log = logging.getLogger("feedline")

INDEX_KIND, INDEX_VERSION = "members", 2
LABEL_EXTENSION = "cls"
IMAGE_MEMBER_EXTENSIONS = tuple(e[1:] for e in IMAGE_EXTENSIONS)  # jpg, jpeg, png, ...
MAX_LABEL_BYTES = 64
_INT64_MAX = (1 << 63) - 1
_ASCII_SPACE = " \t\n\r\x0b\x0c"
_DIGITS = re.compile(r"[0-9]+")
_GZIP_MAGIC = b"\x1f\x8b"
_SCAN_THREADS = 8
_IMAGE_NAMES = ", ".join(f".{e}" for e in IMAGE_MEMBER_EXTENSIONS)


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: ``members`` as ``(name, data_offset, size, label_text | None)`` in archive order,
    ``end``, why the scan stopped before a proper end of the archive (None when it did not), and
    ``end_member``, the member whose header stopped it (where its name could be read)."""

    size: int
    members: tuple[tuple[str, int, int, str | None], ...]
    end: str | None
    end_member: str | None = None


def shard_index(shard: str) -> ShardIndex:
    """The index of ``shard``: the one kept for its current content when every value in it checks out,
    else scanned (and kept)."""
    fingerprint = index_store.Fingerprint.of(shard)
    kept = index_store.load(shard, INDEX_KIND, INDEX_VERSION, fingerprint)
    if kept is not None:
        index = from_payload(kept, fingerprint.size)
        if index is not None:
            return index
    index, is_tar = _scan(shard, fingerprint.size)
    if is_tar:
        index_store.save(shard, INDEX_KIND, INDEX_VERSION, fingerprint, to_payload(index))
    return index


def scan(shard: str) -> ShardIndex:
    """Lists ``shard``'s regular members from its tar headers, stopping where the archive ends early or turns
    invalid, then reads the text of its short ``.cls`` members."""
    return _scan(shard, os.stat(shard).st_size)[0]


def _scan(shard: str, size: int) -> tuple[ShardIndex, bool]:
    """The index, and whether the file holds a tar header at all."""
    fd = os.open(shard, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        listing = list_members(lambda at, n: os.pread(fd, n, at), size)
        if listing.headers == 0 and listing.end is not None:
            return ShardIndex(size, (), _unreadable(fd, size, listing.end)), False
        members = _with_labels(fd, listing.members, size)
    finally:
        os.close(fd)
    return ShardIndex(size, members, listing.end, listing.end_member), True


def _unreadable(fd: int, size: int, why: str) -> str:
    if size == 0:
        return "the shard is empty (0 bytes)"
    if os.pread(fd, 2, 0) == _GZIP_MAGIC:
        return ("the shard is gzip-compressed; members are read by their offsets, so shards must be "
                "uncompressed .tar files")
    return f"not a tar file ({why})"


def _with_labels(fd: int, members: tuple[tuple[str, int, int], ...], size: int
                 ) -> tuple[tuple[str, int, int, str | None], ...]:
    return tuple((name, offset, length, os.pread(fd, length, offset).decode("latin-1")
                  if _carries_text(name, offset, length, size) else None)
                 for name, offset, length in members)


def _carries_text(name: str, offset: int, length: int, size: int) -> bool:
    return offset + length <= size and length <= MAX_LABEL_BYTES and _extension(name) == LABEL_EXTENSION


def to_payload(index: ShardIndex) -> dict:
    return {"members": [[n, o, s] if t is None else [n, o, s, t] for n, o, s, t in index.members],
            "end": index.end, "end_member": index.end_member}


def from_payload(payload: dict, size: int) -> ShardIndex | None:
    """The index that ``payload`` holds for a shard of ``size`` bytes, or None where any value is not one that
    a scan of such a shard could have produced: then the shard is scanned again."""
    members = payload.get("members")
    end, end_member = payload.get("end"), payload.get("end_member")
    if not isinstance(members, list) or not _optional_text(end) or not _optional_text(end_member):
        return None
    out = []
    next_header = 0  # members lie in archive order, each after its own header
    for k, member in enumerate(members):
        if not isinstance(member, list) or len(member) not in (3, 4):
            return None
        name, offset, length = member[:3]
        text = member[3] if len(member) == 4 else None
        if not isinstance(name, str) or not name or "\0" in name or not _count(offset) or not _count(length):
            return None
        if offset % BLOCK or offset < next_header + BLOCK:
            return None
        if offset + length > size and (k != len(members) - 1 or end is None):
            return None  # only the last member of a truncated shard reaches past its end
        if (text is not None) != _carries_text(name, offset, length, size):
            return None
        if text is not None and (not isinstance(text, str) or len(text) != length
                                 or any(ord(c) > 0xFF for c in text)):
            return None
        next_header = offset + -(-length // BLOCK) * BLOCK
        out.append((name, offset, length, text))
    if end is None and next_header + BLOCK > size:
        return None  # a proper end of the archive needs its end-of-archive block inside the file
    return ShardIndex(size, tuple(out), end, end_member)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _optional_text(value: object) -> bool:
    return value is None or isinstance(value, str)


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
        if problem is not None:  # never read: its offset and size (which may be anything a header claimed) go
            self.problems[len(self.where)] = problem
            offset = size = 0
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
            self.add(self._stop_where(shard, index), number, 0, 0, -1, f"no samples: {reason}")
            self.placeholders += 1
        elif index.end is not None and not end_told:
            self.add(self._stop_where(shard, index), number, 0, 0, -1, index.end)
            self.placeholders += 1

    @staticmethod
    def _stop_where(shard: str, index: ShardIndex) -> str:
        """What a shard-level problem is named by: ``shard:member`` where a member's header stopped the scan."""
        return f"{shard}:{index.end_member}" if index.end_member else shard


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

    def open_sample(self, index: int) -> OpenedSample:
        where = self.paths[index]
        problem = self._problems.get(index)
        if problem is not None:
            raise DataError(where, problem)
        offset, length = int(self._offset[index]), int(self._length[index])
        if length == 0:
            raise DataError(where, "image member is empty (0 bytes)")
        fd, owned = self._open(int(self._shard[index]))
        return _Member(fd, offset, length, where, owned)

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


class _Member(OpenedSample):
    __slots__ = ()

    def shorter(self, ends: int) -> str:
        return (f"the shard is shorter than when it was indexed: the member needs bytes {self.start}.."
                f"{self.start + self.length}, the shard ends at byte {self.start + ends} (changed or truncated "
                f"after the dataset was listed)")


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
    except OSError as exc:  # unreadable: one bad sample named by the shard, raised or skipped when met
        return ShardIndex(0, (), f"the shard cannot be read: {exc.strerror or exc}")
