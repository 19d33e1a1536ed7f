"""What feedline learns about a user's file (a text file's line index, a tar shard's member index), kept for
the next run, and used only while it still describes the file.

Where: beside the file as a hidden sidecar (``pipelines.own_files``); where that folder cannot be written, in
the folder ``FEEDLINE_INDEX_DIR`` names if it is set, else in this process's memory (said once per folder).
Writing never follows a link planted at the temporary name (``O_CREAT|O_EXCL|O_NOFOLLOW``), never leaves its
temporary file behind, and replaces the sidecar in one step, so a reader sees the old one or the new one.

Trust: a sidecar is used only while the file's :class:`Fingerprint` is the one it was made from: size,
modification and change times, inode, and a digest of the file's first and last blocks. ``rsync -t`` or
``cp -p`` keep size and modification time but not the inode or the change time; a rewrite in place changes
the change time. Callers still validate every value they read from a sidecar (``load`` hands back what was
saved; a value out of range means the caller rebuilds).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import threading
from dataclasses import asdict, dataclass

from ...pipelines.own_files import sidecar_name

log = logging.getLogger("feedline")

INDEX_DIR_ENV = "FEEDLINE_INDEX_DIR"
FINGERPRINT_BLOCK = 1 << 16
MAX_SIDECAR_BYTES = 1 << 28  # far above any index feedline writes (indexes are O(chunks)); a larger file is not ours
_FORMAT = "feedline-sidecar"

_memory: dict[tuple[str, str], tuple[dict, dict]] = {}
_memory_lock = threading.Lock()
_warned: set[str] = set()


@dataclass(frozen=True)
class Fingerprint:
    """What identifies one version of a file's content."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int
    head: str  # sha256 of the first FINGERPRINT_BLOCK bytes
    tail: str  # sha256 of the last FINGERPRINT_BLOCK bytes (overlapping the head in a small file)

    @classmethod
    def of(cls, path: str | os.PathLike) -> Fingerprint:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            head = os.pread(fd, FINGERPRINT_BLOCK, 0)
            tail = os.pread(fd, FINGERPRINT_BLOCK, max(st.st_size - FINGERPRINT_BLOCK, 0))
        finally:
            os.close(fd)
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                   hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest())


def sidecar_path(path: str | os.PathLike, kind: str) -> str:
    folder, name = os.path.split(os.fspath(path))
    return os.path.join(folder, sidecar_name(name, kind))


def _elsewhere_path(path: str, kind: str) -> str | None:
    folder = os.environ.get(INDEX_DIR_ENV)
    if not folder:
        return None
    key = hashlib.sha256(os.path.realpath(path).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(folder, sidecar_name(f"{key}-{os.path.basename(path)}", kind))


def load(path: str | os.PathLike, kind: str, version: int, fingerprint: Fingerprint) -> dict | None:
    """The payload saved for this version of ``path``'s content, or None (absent, unreadable, not ours, of
    another version or made from other content)."""
    path = os.fspath(path)
    for candidate in (sidecar_path(path, kind), _elsewhere_path(path, kind)):
        if candidate is None:
            continue
        payload = _read(candidate, kind, version, fingerprint)
        if payload is not None:
            return payload
    with _memory_lock:
        kept = _memory.get((os.path.realpath(path), kind))
    if kept is not None and kept[0] == {"version": version, **asdict(fingerprint)}:
        return kept[1]
    return None


def _read(candidate: str, kind: str, version: int, fingerprint: Fingerprint) -> dict | None:
    try:
        fd = os.open(candidate, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size > MAX_SIDECAR_BYTES:
            return None
        with os.fdopen(fd, "rb") as f:
            fd = -1
            doc = json.loads(f.read())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("kind") != kind \
            or doc.get("version") != version or doc.get("fingerprint") != asdict(fingerprint):
        return None
    payload = doc.get("payload")
    return payload if isinstance(payload, dict) else None


def save(path: str | os.PathLike, kind: str, version: int, fingerprint: Fingerprint, payload: dict) -> str:
    """Keep ``payload`` for this version of ``path``'s content; returns where it went: a sidecar's path, or
    ``"memory"`` where no folder could take it."""
    path = os.fspath(path)
    text = json.dumps({"format": _FORMAT, "kind": kind, "version": version, "fingerprint": asdict(fingerprint),
                       "payload": payload}, separators=(",", ":"))
    errors = []
    for target in (sidecar_path(path, kind), _elsewhere_path(path, kind)):
        if target is None:
            continue
        try:
            _write(target, text)
            return target
        except OSError as exc:
            errors.append(f"{target}: {exc.strerror or exc}")
    with _memory_lock:
        _memory[(os.path.realpath(path), kind)] = ({"version": version, **asdict(fingerprint)}, payload)
        folder = os.path.dirname(os.path.abspath(path))
        first = folder not in _warned
        _warned.add(folder)
    if first:
        log.warning("feedline: cannot keep the %s index of files in %s (%s); it is kept in this process's memory, "
                    "so every new process builds it again. Set %s to a writable folder to keep indexes there.",
                    kind, folder, "; ".join(errors), INDEX_DIR_ENV)
    return "memory"


def _write(target: str, text: str) -> None:
    folder = os.path.dirname(target)
    if folder:
        os.makedirs(folder, exist_ok=True)
    write_file(target, [text.encode("utf-8")])


def write_file(target: str, pieces: list) -> int:
    """``pieces`` (bytes-like) written to ``target`` in one step: a temporary file beside it (never following a
    link planted at its name) renamed into place, removed on failure; the size written."""
    temporary = f"{target}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(temporary, flags, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            fd = -1
            for piece in pieces:
                f.write(piece)
            size = f.tell()
        os.replace(temporary, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return size


def forget_memory() -> None:
    """Drop the indexes kept in memory (tests)."""
    with _memory_lock:
        _memory.clear()
        _warned.clear()
