"""A gzip file's decompressed bytes, front to back, in pieces of bounded size.

zlib directly rather than ``gzip.GzipFile``: output is asked for in pieces of at most the caller's limit
(``max_length``), so memory stays bounded whatever the file holds (one enormous line included) and the time
is linear. Files of several gzip members (``cat a.gz b.gz``) read as one stream, zero padding after the last
member is allowed (as ``gzip`` allows it), and a file cut short, with a bad checksum or with other bytes after
its last member raises :class:`GzipError`.
"""
from __future__ import annotations

import zlib

GZIP_MAGIC = b"\x1f\x8b"
COMPRESSED_BLOCK = 1 << 18


class GzipError(ValueError):
    """The file is not a whole, readable gzip file; the message says why."""


class GzipStream:
    def __init__(self, path: str):
        self.path = path
        self.position = 0  # decompressed bytes handed out
        self._file = open(path, "rb")
        self._input = b""         # compressed bytes not yet given to the decompressor
        self._decompressor = None  # None between members
        self._started = False
        self._file_done = False

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
                if d.eof:
                    self._input = d.unused_data + self._input
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
