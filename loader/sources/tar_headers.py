"""Listing the members of a tar archive from its 512-byte headers (ustar, GNU and pax), every field checked
before it is used.

Python's ``tarfile`` trusts a header's size: a negative one (base-256, or octal with a minus sign) sends its
reader backwards, to loop forever on one header with growing memory or to fail with a bare ``OSError``. Here
a size is a run of octal digits or a positive base-256 number, a checksum must match, a pax record must be
well formed and lie inside its header's data, and the scan only moves forward (by at least one block per
header), so it ends on every input: at tar's end-of-archive block, at the end of the file, or at the first
header that is not valid, with a sentence that says which and where.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

BLOCK = 512
MAX_META_BYTES = 1 << 20  # a pax header or GNU long name above this is not one that a writer made
_ZERO_BLOCK = bytes(BLOCK)
_OCTAL = frozenset(b"01234567")
_REGULAR = frozenset(b"07\0")          # regular file, contiguous file, old-style regular file
_NO_DATA = frozenset(b"123456")        # hard and symbolic links, devices, directories, FIFOs: no data follows
_POSIX_MAGIC = b"ustar\x0000"


class BadHeader(ValueError):
    """A header that cannot be trusted: ``member`` is its name where the name field could be read."""

    def __init__(self, reason: str, member: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.member = member


@dataclass(frozen=True)
class Listing:
    """The regular members ``(name, data_offset, size)`` in archive order, and ``end``: None where the archive
    ended with its end-of-archive block, else why the scan stopped (``end_member``: the member whose header
    was bad, where its name could be read)."""

    members: tuple[tuple[str, int, int], ...]
    end: str | None
    end_member: str | None = None
    headers: int = 0  # valid headers read (0: not a tar archive at all)


def blocks(size: int) -> int:
    """Bytes that ``size`` bytes of member data occupy (whole blocks)."""
    return -(-size // BLOCK) * BLOCK


def list_members(read_at: Callable[[int, int], bytes], size: int) -> Listing:
    """The members of the archive of ``size`` bytes that ``read_at(offset, length)`` reads."""
    members: list[tuple[str, int, int]] = []
    extended: dict[str, bytes] = {}   # the next member's pax records and GNU long names
    global_pax: dict[str, bytes] = {}
    offset = headers = 0
    while True:
        if offset >= size:
            if members and members[-1][1] + members[-1][2] > size:
                name, at, length = members[-1]
                return Listing(tuple(members), f"the shard is truncated: it ends at byte {size}, inside member "
                                               f"{name!r} (bytes {at}..{at + length})", headers=headers)
            return Listing(tuple(members), f"the shard is truncated: it ends at byte {size} without tar's "
                                           f"end-of-archive blocks, so members after that point are missing",
                           headers=headers)
        if offset + BLOCK > size:
            return Listing(tuple(members), f"the shard is truncated: it ends at byte {size}, inside the tar "
                                           f"header that starts at byte {offset}", headers=headers)
        block = read_at(offset, BLOCK)
        if len(block) < BLOCK:
            return Listing(tuple(members), f"the shard is truncated: it ends inside the tar header that starts at "
                                           f"byte {offset} (changed while it was read)", headers=headers)
        if block == _ZERO_BLOCK:
            return Listing(tuple(members), None, headers=headers)
        try:
            kind, name, length = _header(block)
            data_at = offset + BLOCK
            if kind in b"xgLK":
                owner = _following_name(read_at, data_at + blocks(length), size) or name  # the member it is for
                meta = _meta(read_at, data_at, length, size, owner)
                if kind == ord("x"):
                    extended.update(_pax_records(meta, owner))
                elif kind == ord("g"):
                    global_pax.update(_pax_records(meta, owner))
                else:  # GNU long name (L) or long link name (K), NUL-terminated
                    extended["path" if kind == ord("L") else "linkpath"] = meta.split(b"\0", 1)[0]
                headers += 1
                offset = data_at + blocks(length)
                continue
            records = {**global_pax, **extended}
            if "path" in records:
                name = _text(records["path"])
            if "size" in records:
                length = _pax_size(records["size"], name)
            if any(key.startswith("GNU.sparse.") for key in records) or kind == ord("S"):
                raise BadHeader(f"member {name!r} is a sparse file, which webdataset shards do not hold "
                                f"(store it as a regular file)", name)
        except BadHeader as bad:
            return Listing(tuple(members), f"invalid tar header at byte {offset}: {bad.reason}; the members from "
                                           f"there on cannot be read", bad.member, headers)
        headers += 1
        extended = {}
        if kind in _REGULAR and not (kind == 0 and name.endswith("/")):
            members.append((name, data_at, length))
            offset = data_at + blocks(length)
        elif kind in _NO_DATA or kind == 0:
            offset = data_at
        else:  # a type this reader does not know: its data is skipped, as tar does
            offset = data_at + blocks(length)


def _following_name(read_at: Callable[[int, int], bytes], at: int, size: int) -> str | None:
    """The name in the header at ``at`` (the member an extended header is for), if one is readable there."""
    if at + BLOCK > size:
        return None
    try:
        return _header(read_at(at, BLOCK))[1]
    except BadHeader:
        return None


def _header(block: bytes) -> tuple[int, str, int]:
    """(type flag, name, size) of a header block, or BadHeader."""
    name = _name(block)
    stored = _octal(block[148:156])
    if stored is None:
        raise BadHeader("its checksum field is not an octal number (not a tar header)", name)
    unsigned = sum(block) - sum(block[148:156]) + 8 * 0x20  # the checksum field counts as spaces
    if stored != unsigned and stored != _signed_checksum(block, unsigned):
        raise BadHeader(f"its checksum is {stored} but the header's bytes sum to {unsigned} (not a tar header, "
                        f"or a damaged one)", name)
    field = block[124:136]
    if field[0] == 0xFF:
        raise BadHeader(f"member {name!r} has a negative size (base-256 field {field.hex()})", name)
    if field[0] == 0x80:
        length = int.from_bytes(field[1:], "big")
    else:
        length = _octal(field)
        if length is None:
            raise BadHeader(f"member {name!r} has a size field that is not an octal number: {bytes(field)!r}", name)
    return block[156], name, length


def _signed_checksum(block: bytes, unsigned: int) -> int:
    """The sum some old writers stored: bytes above 127 counted as negative."""
    high = sum(1 for b in block[:148] if b > 127) + sum(1 for b in block[156:] if b > 127)
    return unsigned - 256 * high


def _name(block: bytes) -> str:
    name = block[:100].split(b"\0", 1)[0]
    if block[257:265] == _POSIX_MAGIC:
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return _text(name)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _octal(field: bytes) -> int | None:
    """An octal number field: digits, cut at the first NUL, spaces around allowed; None if it is not one."""
    digits = field.split(b"\0", 1)[0].strip(b" ")
    if not digits:
        return 0
    if not _OCTAL.issuperset(digits):
        return None
    return int(digits, 8)


def _meta(read_at: Callable[[int, int], bytes], at: int, length: int, size: int, name: str) -> bytes:
    if length > MAX_META_BYTES:
        raise BadHeader(f"an extended header ({name!r}) claims {length} bytes, more than any tar writer makes", name)
    if at + length > size:
        raise BadHeader(f"the shard ends at byte {size}, inside the extended header {name!r} "
                        f"(bytes {at}..{at + length})", name)
    data = read_at(at, length)
    if len(data) < length:
        raise BadHeader(f"the extended header {name!r} could not be read whole (changed while it was read)", name)
    return data


def _pax_records(data: bytes, name: str) -> dict[str, bytes]:
    """``"<length> <key>=<value>\\n"`` records; NUL padding after the last one is allowed."""
    records: dict[str, bytes] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise BadHeader(f"pax header {name!r}: the record at byte {pos} does not start with its length", name)
        end = pos + int(digits)
        if end <= space + 2 or end > len(data) or data[end - 1] != 0x0A:
            raise BadHeader(f"pax header {name!r}: the record at byte {pos} claims {int(digits)} bytes, which do not "
                            f"end with a newline inside the header", name)
        key, eq, value = data[space + 1:end - 1].partition(b"=")
        if not eq or not key:
            raise BadHeader(f"pax header {name!r}: the record at byte {pos} is not 'key=value'", name)
        records[_text(key)] = value
        pos = end
    return records


def _pax_size(value: bytes, name: str) -> int:
    if not value.isdigit():
        raise BadHeader(f"member {name!r} has a pax size that is not a non-negative integer: {value[:40]!r}", name)
    return int(value)
