"""Parsed chunks of a text table kept on disk in the converted form (``columnar``'s row records), one file per
chunk, so that a later epoch or run reads a chunk with one ``preadv`` instead of parsing it again.

A chunk file, little-endian: a header (``HEADER``: magic, the key of the folder it belongs to, rows, scalar
columns, list columns, the bytes of the records part and of the rest, the seconds a row took to parse when it
was written, the bad rows), one type code per scalar column (``ops.gather_columns.CODES``; integer columns in
the narrowest type holding the chunk's values, float columns float64) padded to 8 bytes; then the records
part exactly as a converted table's chunk (``columnar.RecordLayout``: records, then missing bits); then a JSON
description of the bad rows (row, reason) and list columns, padded to 8 bytes, and the list columns' arrays.
Every value is the parser's own, bad rows' included, so a chunk read back gives the bits parsing gives.

A file is written under a temporary name (``O_EXCL|O_NOFOLLOW``) and renamed into place, so a reader (another
thread, rank or run) sees a whole chunk or none; a file that is not exactly what its header says (cut short,
another key, another shape) is not read, and its chunk is parsed instead.
"""
from __future__ import annotations

import functools
import json
import os
import struct
import time
from typing import NamedTuple

import numpy as np

from ... import ops
from ...ops.gather_columns import CODES, DTYPES
from .columnar import RecordLayout
from .index_store import write_file
from .table_rows import ListColumn

MAGIC = b"FLCHUNK1"
HEADER = struct.Struct("<8s16sQIIQQdQ")  # magic, key, rows, columns, lists, records bytes, rest bytes, s/row, bad
KEY_BYTES = 16
STALE_TEMPORARY_S = 600.0  # a temporary chunk file this old was left by a process that died while writing it
_INTEGERS = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.int64))
_INTEGER_CODES = frozenset(CODES[d] for d in _INTEGERS)
_FLOAT_CODE = CODES[np.dtype(np.float64)]


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def header_bytes(columns: int) -> int:
    return _padded(HEADER.size + columns)


def chunk_name(chunk: int) -> str:
    return f"c{chunk:08d}.feedline-chunk"


class ParsedChunk(NamedTuple):
    """A chunk as the parser gave it: int64 [rows, integer columns], float64 [rows, float columns], bool missing
    [rows, both], list columns by name, bad rows and their reasons (row within the chunk -> reason)."""

    ints: np.ndarray
    floats: np.ndarray
    missing: np.ndarray
    lists: dict
    bad: np.ndarray
    reasons: dict


class StoredChunk(NamedTuple):
    """A chunk read back: its scalar columns as a block of records, its list columns, its bad rows, the seconds
    a row took to parse when it was written, and the file's size."""

    block: ops.ColumnBlock
    lists: dict
    bad: np.ndarray
    reasons: dict
    parse_s_per_row: float
    nbytes: int


class Encoded(NamedTuple):
    """A parsed chunk encoded: the pieces of its chunk file, in order, and its scalar columns as the block of
    records a read of that file gives (the same bytes, in memory)."""

    pieces: list
    block: ops.ColumnBlock


class _Plan(NamedTuple):
    """How the chunks whose columns have one set of type codes are encoded (the same for most of a table's)."""

    layout: RecordLayout
    template: np.ndarray  # the block's layout, flags placed at 0 (``_shape``)
    columns: np.ndarray  # integer columns, widest first
    slots: np.ndarray  # each one's element in a record (of its width), then each float column's (float64)
    ends: np.ndarray  # how many of ``columns`` take 8, 4 and 2 bytes or more


def encode(parsed: ParsedChunk, key: bytes, parse_s_per_row: float) -> list[bytes | np.ndarray]:
    """The pieces of a chunk file, in order."""
    return encoded(parsed, key, parse_s_per_row).pieces


def encoded(parsed: ParsedChunk, key: bytes, parse_s_per_row: float) -> Encoded:
    """The chunk file's pieces and its records as a block (``read``'s, without the file)."""
    rows, num_ints = parsed.ints.shape
    num_floats = parsed.floats.shape[1]
    plan = _plan(_codes(parsed.ints, num_floats), num_ints)
    layout = plan.layout
    size = layout.chunk_bytes(rows)
    records = np.zeros(max(size, 8), dtype=np.uint8)
    if layout.dtypes:
        _kernels()[1](parsed.ints, parsed.floats, np.ascontiguousarray(parsed.missing), plan.columns, plan.slots,
                      plan.ends, layout.record, _padded(rows * layout.record), layout.flag_bytes, records,
                      records.view(np.uint16), records.view(np.uint32), records.view(np.uint64),
                      records.view(np.float64))
    records = records[:size]
    bad = np.flatnonzero(parsed.bad)
    arrays, lists = [], []
    for name, column in parsed.lists.items():
        offsets = np.ascontiguousarray(column.offsets, dtype="<i8")
        values = np.ascontiguousarray(column.values, dtype="<i8")
        lists.append([name, int(offsets.size), int(values.size)])
        arrays += [offsets, values]
    described = _described({"bad": [[int(r), parsed.reasons[int(r)]] for r in bad], "lists": lists}) \
        if bad.size or lists else _NOTHING
    rest = 8 + len(described) + sum(a.nbytes for a in arrays)
    codes = bytes(CODES[d] for d in layout.dtypes)
    head = HEADER.pack(MAGIC, key, rows, len(codes), len(lists), size, rest, float(parse_s_per_row), bad.size) \
        + codes
    head += b"\0" * (header_bytes(len(codes)) - len(head))
    return Encoded([head, records, struct.pack("<Q", len(described)), described, *arrays],
                   ops.ColumnBlock(records, records, _placed(layout, plan.template, rows), rows))


def _placed(layout: RecordLayout, template: np.ndarray, rows: int) -> np.ndarray:
    """The block layout of a chunk of ``rows`` rows: the flags (bits) follow the records."""
    placed = template.copy()
    placed[:, 4] += 8 * _padded(rows * layout.record)
    return placed


# The integer types in the order ``columnar.narrowest`` tries them (the narrowest first), by their bounds.
_BOUND_LOW = np.array([np.iinfo(d).min for d in _INTEGERS], np.int64)
_BOUND_HIGH = np.array([np.iinfo(d).max for d in _INTEGERS], np.int64)
_BOUND_CODES = np.array([CODES[d] for d in _INTEGERS], np.uint8)


def _codes(ints: np.ndarray, num_floats: int) -> bytes:
    """The type code of each column of a chunk: integer columns in the narrowest type holding their values
    (``columnar.narrowest``), float columns float64."""
    rows, num_ints = ints.shape
    codes = np.full(num_ints, _BOUND_CODES[0], np.uint8)
    if rows and num_ints:
        _kernels()[0](ints, _BOUND_LOW, _BOUND_HIGH, _BOUND_CODES, np.empty(num_ints, np.int64),
                      np.empty(num_ints, np.int64), codes)
    return codes.tobytes() + bytes([_FLOAT_CODE]) * num_floats


def _narrowest(ints, low, high, codes, smallest, largest, out):
    """``out[j]``: ``codes[i]`` of the first bound ``low[i]..high[i]`` holding every value of column ``j`` of
    ``ints`` (which has a row; ``smallest``, ``largest``: room for each column's extremes); the last bound holds
    every value."""
    rows, columns = ints.shape
    for j in range(columns):
        smallest[j] = ints[0, j]
        largest[j] = ints[0, j]
    for r in range(1, rows):
        for j in range(columns):
            v = ints[r, j]
            if v < smallest[j]:
                smallest[j] = v
            if v > largest[j]:
                largest[j] = v
    for j in range(columns):
        i = 0
        while i < low.size - 1 and not (low[i] <= smallest[j] and largest[j] <= high[i]):
            i += 1
        out[j] = codes[i]


_plans: dict[bytes, _Plan] = {}


def _plan(codes: bytes, num_ints: int) -> _Plan:
    plan = _plans.get(codes)
    if plan is None:
        layout, template = _shape(codes)
        dtypes = layout.dtypes
        order = sorted(range(num_ints), key=lambda j: -dtypes[j].itemsize)  # integer columns widest first
        widths = [dtypes[j].itemsize for j in order]
        ends = np.array([sum(w >= size for w in widths) for size in (8, 4, 2)], np.int64)
        slots = [layout.offsets[j] // dtypes[j].itemsize for j in order + list(range(num_ints, len(dtypes)))]
        plan = _plans[codes] = _Plan(layout, template, np.array(order, np.int64), np.array(slots, np.int64), ends)
    return plan


def _fill(ints, floats, missing, columns, slots, ends, record, flags_at, flag_bytes, u8, u16, u32, u64, f64):
    """Each row's record and missing bits, written into the zeroed chunk buffer ``u8`` (``u16``..``f64``: views of
    it): integer column ``columns[k]`` at element ``slots[k]`` of the record, in 8 bytes for ``k < ends[0]``, 4
    before ``ends[1]``, 2 before ``ends[2]``, else 1, cut to that width (two's complement, which keeps every value
    of the column's narrowest type); float column ``k`` as float64 at element ``slots[len(columns) + k]``."""
    rows, num_ints = ints.shape
    num_floats = floats.shape[1]
    scalars = num_ints + num_floats
    n = columns.size
    for r in range(rows):
        for k in range(ends[0]):
            u64[r * (record >> 3) + slots[k]] = ints[r, columns[k]]
        for k in range(ends[0], ends[1]):
            u32[r * (record >> 2) + slots[k]] = ints[r, columns[k]] & 0xFFFFFFFF
        for k in range(ends[1], ends[2]):
            u16[r * (record >> 1) + slots[k]] = ints[r, columns[k]] & 0xFFFF
        for k in range(ends[2], n):
            u8[r * record + slots[k]] = ints[r, columns[k]] & 0xFF
        for k in range(num_floats):
            f64[r * (record >> 3) + slots[n + k]] = floats[r, k]
        flags = flags_at + r * flag_bytes
        for b in range(flag_bytes):
            byte = 0
            for bit in range(8):
                j = 8 * b + bit
                if j < scalars and missing[r, j]:
                    byte |= 1 << bit
            u8[flags + b] = byte


@functools.cache
def _kernels():
    """``_narrowest`` and ``_fill`` as GIL-free numba kernels, compiled (or loaded from numba's cache) on first use, so
    that opening a text table imports no numba on the thread that indexes its files."""
    from numba import njit

    from ...ops._numba import fast_loading  # (loaded from the cache without numba's refresh, as every kernel is)

    return fast_loading(njit(nogil=True, cache=True)(_narrowest)), fast_loading(njit(nogil=True, cache=True)(_fill))


def warm_up() -> None:
    """The encoding's kernels loaded (from numba's cache, else compiled) and called once on a chunk typed as a
    parsed one is, so that the first chunk parsed does not wait for them."""
    rows = 2
    encode(ParsedChunk(np.zeros((rows, 1), np.int64), np.zeros((rows, 0), np.float64), np.zeros((rows, 1), bool), {},
                       np.zeros(rows, bool), {}), bytes(KEY_BYTES), 0.0)


def _described(doc: dict) -> bytes:
    text = json.dumps(doc).encode()
    return text + b" " * (_padded(len(text)) - len(text))


_NOTHING = _described({"bad": [], "lists": []})


def layout_of(ints: np.ndarray, num_floats: int) -> RecordLayout:
    """The records of a chunk of these integer columns (each in the narrowest type holding its values) and
    ``num_floats`` float columns."""
    return _shape(_codes(ints, num_floats))[0]


def stored_layout(folder: str, chunk: int, key: bytes, columns: int) -> RecordLayout | None:
    """The records of a kept chunk, from its header alone; None where there is none of this key."""
    try:
        with open(os.path.join(folder, chunk_name(chunk)), "rb") as f:
            head = f.read(header_bytes(columns))
        if len(head) != header_bytes(columns) or HEADER.unpack_from(head)[:2] != (MAGIC, key):
            return None
    except (OSError, struct.error):
        return None
    shape = _shape(head[HEADER.size:HEADER.size + columns])
    return None if shape is None else shape[0]


def write(folder: str, chunk: int, pieces: list) -> int:
    """The chunk file written into ``folder`` in one step (a temporary file renamed into place); its size."""
    return write_file(os.path.join(folder, chunk_name(chunk)), pieces)


class Known:
    """What a chunk file was when last read whole or written (``read``'s ``known``, kept by its caller): where
    it lies, its key, rows, size, header bytes, records' bytes and block layout, and its rest (after the
    records) where that is the plain one (no bad rows, no list columns; others are not noted). A later read of
    a file with that size, header and rest is that chunk again, so ``read`` compares those bytes instead of
    decoding the header and the rest once more: a few steps under the GIL a chunk. (One value, replaced whole:
    threads may share it.)"""

    __slots__ = ("noted",)

    def __init__(self):
        self.noted: _Noted | None = None

    def note(self, path: str, key: bytes, rows: int, size: int, head: bytes, records: int, layout: np.ndarray,
             parse_s: float, rest: bytes | None) -> None:
        self.noted = None if rest is None else _Noted(path, key, rows, size, head, records, layout, parse_s, rest)


# A StoredChunk and its ColumnBlock made in C from a tuple of their fields: a named tuple's own constructor is a
# Python function (a frame each), and a known chunk is read ~2 times a batch in later epochs.
_stored = functools.partial(tuple.__new__, StoredChunk)
_block = functools.partial(tuple.__new__, ops.ColumnBlock)


class _Noted(NamedTuple):
    path: str
    key: bytes
    rows: int
    size: int
    head: bytes
    records: int
    layout: np.ndarray
    parse_s: float
    rest: bytes


def note_written(known: Known, folder: str, chunk: int, key: bytes, size: int, made: Encoded,
                 parse_s_per_row: float) -> None:
    """``known`` is the chunk file ``write`` just wrote (``size`` bytes) from ``made`` (``encoded``'s, with ``key``
    and ``parse_s_per_row``)."""
    head, records = made.pieces[0], made.pieces[1]
    plain = len(made.pieces) == 4 and made.pieces[3] is _NOTHING
    known.note(os.path.join(folder, chunk_name(chunk)), key, made.block.rows, size, head, records.size,
               made.block.layout, float(parse_s_per_row), made.pieces[2] + _NOTHING if plain else None)


_READ_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def read(folder: str, chunk: int, key: bytes, rows: int, columns: int, list_names: tuple[str, ...],
         known: Known | None = None) -> StoredChunk | None:
    """Chunk ``chunk`` of ``rows`` rows from ``folder``, or None where it is absent or not a whole chunk file of
    this key and shape. ``known``: what this chunk's file was when last read or written, for this key and rows
    (a file read whole is noted there)."""
    noted = None if known is None else known.noted
    if noted is not None and noted.key == key and noted.rows == rows:
        stored = _read_noted(noted)
        if stored is not None:
            return stored
    path = os.path.join(folder, chunk_name(chunk))
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        return None
    head_size = header_bytes(columns)
    try:
        size = os.fstat(fd).st_size
        if size < head_size + 8:
            return None
        head = bytearray(head_size)
        data = np.empty(size - head_size, dtype=np.uint8)  # the records, then the rest
        if os.preadv(fd, [head, data], 0) != size:
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    magic, stored_key, stored_rows, stored_columns, num_lists, records_size, rest_size, parse_s, num_bad = \
        HEADER.unpack_from(head)
    if (magic != MAGIC or stored_key != key or stored_rows != rows or stored_columns != columns
            or num_lists != len(list_names) or size != head_size + records_size + rest_size or rest_size < 8
            or not (np.isfinite(parse_s) and parse_s >= 0)):
        return None
    shape = _shape(bytes(head[HEADER.size:HEADER.size + columns]))
    if shape is None or shape[0].chunk_bytes(rows) != records_size:
        return None
    described = _rest(data[records_size:], rows, list_names, num_bad)
    if described is None:
        return None
    bad, reasons, lists = described
    block = ops.ColumnBlock(data, data, _placed(*shape, rows), rows)
    if known is not None:
        plain = not num_bad and not list_names
        known.note(path, key, rows, size, bytes(head), records_size, block.layout, parse_s,
                   data[records_size:].tobytes() if plain else None)
    return StoredChunk(block, lists, bad, reasons, parse_s, size)


def _read_noted(noted: _Noted) -> StoredChunk | None:
    """``read`` of a known chunk file that still has the size, header bytes and rest it had when noted; None
    otherwise (then read whole)."""
    try:
        fd = os.open(noted.path, _READ_FLAGS)
    except OSError:
        return None
    try:
        size = noted.size
        if os.fstat(fd).st_size != size:
            return None
        head = bytearray(len(noted.head))
        data = np.empty(size - len(head), dtype=np.uint8)
        if os.preadv(fd, [head, data], 0) != size or head != noted.head:
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    if data[noted.records:].tobytes() != noted.rest:
        return None
    rows = noted.rows
    return _stored((_block((data, data, noted.layout, rows)), {}, np.zeros(rows, dtype=bool), {}, noted.parse_s,
                    size))


_shapes: dict[bytes, tuple[RecordLayout, np.ndarray] | None] = {}


def _shape(codes: bytes) -> tuple[RecordLayout, np.ndarray] | None:
    """The record layout of chunks whose columns have these type codes, and their block's layout with the flags
    placed at 0 (``ops.ColumnBlock.records``); None for codes no chunk file holds."""
    if codes not in _shapes:
        if not all(c in _INTEGER_CODES or c == _FLOAT_CODE for c in codes):
            return None
        layout = RecordLayout([DTYPES[c] for c in codes])
        template = ops.ColumnBlock.records(np.zeros(8, np.uint8), layout.dtypes, layout.offsets, layout.record, 0,
                                           list(range(len(codes))), layout.flag_bytes, 0).layout
        _shapes[codes] = (layout, template)  # (a race only builds the same value twice)
    return _shapes[codes]


def _rest(rest: np.ndarray, rows: int, list_names: tuple[str, ...], num_bad: int):
    """The bad rows (a mask and the reasons) and the list columns described after the records; None where the
    description does not hold together."""
    try:
        length = struct.unpack_from("<Q", rest)[0]
        if not num_bad and not list_names and rest[8:].tobytes() == _NOTHING:
            return np.zeros(rows, dtype=bool), {}, {}  # (what most chunks hold: no bad rows, no lists)
        doc = json.loads(rest[8:8 + length].tobytes())
        at = 8 + length
        bad = np.zeros(rows, dtype=bool)
        reasons = {}
        for row, reason in doc["bad"]:
            if not (isinstance(row, int) and 0 <= row < rows and isinstance(reason, str)) or bad[row]:
                return None
            bad[row] = True
            reasons[row] = reason
        if len(reasons) != num_bad or [name for name, _, _ in doc["lists"]] != list(list_names):
            return None
        lists = {}
        for name, num_offsets, num_values in doc["lists"]:
            if num_offsets != rows + 1 or num_values < 0 or at + 8 * (num_offsets + num_values) > len(rest):
                return None
            offsets = np.frombuffer(rest, "<i8", num_offsets, at).astype(np.int64)
            values = np.frombuffer(rest, "<i8", num_values, at + 8 * num_offsets).astype(np.int64)
            at += 8 * (num_offsets + num_values)
            if offsets[0] != 0 or offsets[-1] != num_values or (np.diff(offsets) < 0).any():
                return None
            lists[name] = ListColumn(offsets, values)
        if at != rest.size:
            return None
    except (ValueError, TypeError, KeyError, struct.error):
        return None
    return bad, reasons, lists


def remove_stale_temporaries(folder: str) -> None:
    """Temporary chunk files left by processes that died while writing them."""
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.name.endswith(".tmp") and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMPORARY_S:
                os.unlink(entry.path)
        except OSError:
            pass
