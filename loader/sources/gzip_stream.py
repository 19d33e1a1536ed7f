"""A gzip file's decompressed bytes, front to back, in pieces of bounded size.

zlib directly rather than ``gzip.GzipFile``: output is asked for in pieces of at most the caller's limit
(``max_length``), so memory stays bounded whatever the file holds (one enormous line included) and the time
is linear. Files of several gzip members (``cat a.gz b.gz``) read as one stream, zero padding after the last
member is allowed (as ``gzip`` allows it), and a file cut short, with a bad checksum or with other bytes after
its last member raises :class:`GzipError`.

A stream can be marked where it stands (:meth:`GzipStream.mark`: the decompressor's state, a copy of about
10-40 KB, and the file offset of the input it has not taken yet) and a new stream started from a mark
(:meth:`GzipStream.resume`), so going back to a point passed before costs the distance from the nearest mark,
not a decompression from the top of the file.
"""
from __future__ import annotations

import zlib
from typing import NamedTuple

GZIP_MAGIC = b"\x1f\x8b"
COMPRESSED_BLOCK = 1 << 18


class GzipError(ValueError):
    """The file is not a whole, readable gzip file; the message says why."""


class Mark(NamedTuple):
    """Where a stream stood: its decompressed position, the file offset of the compressed bytes it had not
    given to its decompressor yet, that decompressor's state (None between members), and whether a member had
    begun."""

    position: int
    offset: int
    decompressor: object
    started: bool


class GzipStream:
    def __init__(self, path: str, mark: Mark | None = None):
        self.path = path
        self.position = 0  # decompressed bytes handed out
        self._file = open(path, "rb")
        self._input = b""         # compressed bytes not yet given to the decompressor
        self._decompressor = None  # None between members
        self._started = False
        self._file_done = False
        if mark is not None:
            self._file.seek(mark.offset)
            self.position, self._started = mark.position, mark.started
            self._decompressor = None if mark.decompressor is None else mark.decompressor.copy()

    def mark(self) -> Mark:
        d = self._decompressor
        return Mark(self.position, self._file.tell() - len(self._input), None if d is None else d.copy(),
                    self._started)

    @property
    def compressed_position(self) -> int:
        """Bytes of the file given to the decompressor so far (how far through the file the stream is)."""
        return self._file.tell() - len(self._input)

    @classmethod
    def resume(cls, path: str, mark: Mark) -> GzipStream:
        """A new stream of ``path`` that goes on from ``mark`` (the mark stays usable)."""
        return cls(path, mark)

    def read(self, limit: int) -> bytes:
        """Up to ``limit`` (> 0) more bytes of the decompressed stream; ``b""`` at its end."""
        try:
            while True:
                if self._decompressor is None:
                    if not self._begin_member():
                        return b""
                d = self._decompressor
                out = d.decompress(self._input, limit)
                self._input = d.unconsumed_tail
                if d.eof:  # what follows the member; the tail may repeat it (CPython sets both at the end)
                    self._input = d.unused_data
                    self._decompressor = None
                if out:
                    self.position += len(out)
                    return out
                if self._decompressor is not None and not self._input:
                    if not self._more():
                        raise GzipError("it ends in the middle of its compressed data (the file is cut short)")
        except zlib.error as e:
            raise GzipError(f"its compressed data is corrupt ({e})") from None

    def _more(self) -> bool:
        if self._file_done:
            return False
        block = self._file.read(COMPRESSED_BLOCK)
        if not block:
            self._file_done = True
            return False
        self._input += block
        return True

    def _begin_member(self) -> bool:
        """Start the next member; False at the end of the file (after zero padding, if any)."""
        while True:
            if self._started:  # zero padding may follow the last member
                self._input = self._input.lstrip(b"\x00")
            if len(self._input) >= 2 or not self._more():
                break
        if not self._input:
            if not self._started:
                raise GzipError("it is empty, not a gzip file")
            return False
        if not self._input.startswith(GZIP_MAGIC):
            raise GzipError("it is not a gzip file" if not self._started else
                            "it has other data after its last gzip member")
        self._decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._started = True
        return True

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> GzipStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
