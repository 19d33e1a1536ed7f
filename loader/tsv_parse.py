"""Vectorised parsing of tab-separated lines of decimal and hexadecimal integers.

Input is a *line buffer*: ``PAD`` filler bytes, then lines that each end in ``\\n``. Fields are found with one
``np.flatnonzero`` over the bytes; each field is then read as 8-byte words (an unaligned uint64 view of the
buffer, one word per field ending at the field's last byte) and converted with SWAR arithmetic: a handful of
uint64 operations per field instead of a Python call per value. Fields longer than 8 characters take one or
two more words; only fields too long for that (19+ decimal digits, 17+ hex digits) go through Python ``int``.

Every check is per field, so a bad line is found and explained without stopping the others.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..pipelines.tabular import ColumnKind, Column

PAD = 8  # filler before the first line, so an 8-byte word ending at any field starts inside the buffer
_FILLER = b"0" * (PAD - 1)

_U = np.uint64
_ZEROS = _U(0x3030303030303030)
_HIGH_BITS = _U(0x8080808080808080)
_LOWER_CASE = _U(0x2020202020202020)
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_BYTE_ONES = _U(0x0101010101010101)
_LANES_8 = _U(0x00FF00FF00FF00FF)
_LANES_16 = _U(0x0000FFFF0000FFFF)
_LANES_32 = _U(0x00000000FFFFFFFF)
# _KEEP[n]: the top n bytes of a word (the last n characters before the field's end).
_KEEP = np.array([((1 << 64) - 1) ^ ((1 << (8 * (8 - n))) - 1) for n in range(9)], dtype=np.uint64)
_INT64_MAX = (1 << 63) - 1

OK, NOT_NUMBER, OUT_OF_RANGE, EMPTY = 0, 1, 2, 3


def join_lines(pieces: list) -> np.ndarray:
    """A line buffer from byte strings without their newlines."""
    return np.frombuffer(b"\n".join([_FILLER, *pieces, b""]), dtype=np.uint8)


def _words(buf: np.ndarray) -> np.ndarray:
    """word[i] = the 8 bytes buf[i:i+8] as a little-endian uint64 (an unaligned view, no copy)."""
    return np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _in_range(x: np.ndarray, low: int, high: int) -> np.ndarray:
    """Per byte of ASCII words: 0x80 where low <= byte <= high, else 0."""
    return (x + _U((0x80 - low) * 0x0101010101010101)) & ~(x + _U((0x7F - high) * 0x0101010101010101)) & _HIGH_BITS


def _word(words: np.ndarray, end: np.ndarray, count: np.ndarray) -> np.ndarray:
    """The ``count`` (0..8) characters before ``end`` as a word, the bytes before them replaced by '0'."""
    keep = _KEEP[count]
    return (words[end - 8] & keep) | (_ZEROS & ~keep)


def _decimal_word(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = ((w & _HIGH_BITS) == 0) & (_in_range(w, 0x30, 0x39) == _HIGH_BITS)
    d = w - _ZEROS
    d = (d * _U(10) + (d >> _U(8))) & _LANES_8
    d = (d * _U(100) + (d >> _U(16))) & _LANES_16
    d = (d * _U(10000) + (d >> _U(32))) & _LANES_32
    return d, ok


def _hex_word(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = w | _LOWER_CASE  # 'A'-'F' -> 'a'-'f'; bytes below 0x20 never reach here (they split fields)
    ok = ((w & _HIGH_BITS) == 0) & ((_in_range(x, 0x30, 0x39) | _in_range(x, 0x61, 0x66)) == _HIGH_BITS)
    n = (x & _LOW_NIBBLES) + _U(9) * ((x >> _U(6)) & _BYTE_ONES)
    t = ((n & _LANES_8) << _U(4)) | ((n >> _U(8)) & _LANES_8)
    t = ((t & _LANES_16) << _U(8)) | ((t >> _U(16)) & _LANES_16)
    return ((t & _LANES_32) << _U(16)) | (t >> _U(32)), ok


def parse_decimal(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fields buf[start:end] as optionally signed decimal int64 -> (values, status codes); empty fields are 0."""
    words = _words(buf)
    negative = buf[start] == ord("-")  # an empty field's start is its separator, never '-'
    digits_start = start + negative
    length = end - digits_start
    code = np.where(negative & (length == 0), NOT_NUMBER, OK).astype(np.int8)
    low, ok = _decimal_word(_word(words, end, np.minimum(length, 8)))
    values = low.astype(np.int64)
    code[~ok] = NOT_NUMBER
    long = np.flatnonzero(length > 8)
    if long.size:
        e, n = end[long], length[long]
        middle, ok_m = _decimal_word(_word(words, e - 8, np.clip(n - 8, 0, 8)))
        high, ok_h = _decimal_word(_word(words, e - 16, np.clip(n - 16, 0, 2)))
        values[long] += middle.astype(np.int64) * 10**8 + high.astype(np.int64) * 10**16
        code[long[~(ok_m & ok_h)]] = NOT_NUMBER
        _slow(buf, long[n > 18], digits_start, end, values, code, base=10)
    np.negative(values, out=values, where=negative)
    return values, code


def parse_hex(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fields buf[start:end] as unsigned hexadecimal (at most int64's range) -> (int64 values, status codes)."""
    words = _words(buf)
    length = end - start
    low, ok = _hex_word(_word(words, end, np.minimum(length, 8)))
    values = low.astype(np.int64)
    code = np.where(ok, OK, NOT_NUMBER).astype(np.int8)
    long = np.flatnonzero(length > 8)
    if long.size:
        e, n = end[long], length[long]
        high, ok_h = _hex_word(_word(words, e - 8, np.clip(n - 8, 0, 8)))
        values[long] |= (high.astype(np.int64) & 0x7FFFFFFF) << 32
        code[long[~ok_h]] = NOT_NUMBER
        code[long[ok_h & (high >= _U(1 << 31))]] = OUT_OF_RANGE
        _slow(buf, long[n > 16], start, end, values, code, base=16)
    return values, code


def _slow(buf, fields, start, end, values, code, base: int) -> None:
    """Fields too long for the word path (leading zeros, or out of int64 range): Python ``int``."""
    for f in fields.tolist():
        text = bytes(buf[start[f]:end[f]])
        if not text.isalnum() or not text.isascii():
            code[f] = NOT_NUMBER
            continue
        try:
            value = int(text, base)
        except ValueError:
            code[f] = NOT_NUMBER
            continue
        if value > _INT64_MAX:
            code[f] = OUT_OF_RANGE
        else:
            values[f] = value
            code[f] = OK


@dataclass
class ParsedLines:
    """The result of parsing ``n`` lines. ``lines``: the lines that had the right number of fields (their
    columns are in ``values``/``missing``, one entry per such line); ``bad``: every bad line of the ``n``."""

    values: dict[str, np.ndarray]
    missing: dict[str, np.ndarray]
    lines: np.ndarray
    bad: np.ndarray
    _explain: object

    def reason(self, line: int) -> str:
        return self._explain(line)


def parse_lines(buf: np.ndarray, n: int, columns: tuple[Column, ...]) -> ParsedLines:
    """Parse a line buffer holding ``n`` lines of ``len(columns)`` tab-separated fields."""
    num_fields = len(columns)
    sep = np.flatnonzero(buf[PAD:] < 0x20)
    sep += PAD
    char = buf[sep]
    newline = char == 0x0A
    control = np.flatnonzero((char != 0x09) != newline)  # neither tab nor newline
    if sep.size == n * num_fields and not control.size and newline[num_fields - 1::num_fields].all():
        ends = sep.reshape(n, num_fields)
        lines = np.arange(n)
        line_start = np.empty(n, dtype=np.int64)
        line_start[0] = PAD
        line_start[1:] = ends[:-1, -1] + 1
        count = None
    else:
        line_of = np.cumsum(newline) - newline
        count = np.bincount(line_of, minlength=n)
        good = count == num_fields
        good[line_of[control]] = False
        ends = sep[good[line_of]].reshape(-1, num_fields)
        lines = np.flatnonzero(good)
        line_start = np.concatenate([[PAD], sep[newline][:-1] + 1])[lines]
    starts = np.empty_like(ends)
    starts[:, 0] = line_start
    starts[:, 1:] = ends[:, :-1] + 1

    values: dict[str, np.ndarray] = {}
    missing: dict[str, np.ndarray] = {}
    codes = np.zeros(ends.shape, dtype=np.int8)
    for kind, parse in ((ColumnKind.INT, parse_decimal), (ColumnKind.HEX, parse_hex)):
        idx = [j for j, c in enumerate(columns) if c.kind is kind]
        if not idx or not lines.size:
            continue
        s, e = starts[:, idx].ravel(), ends[:, idx].ravel()
        v, code = parse(buf, s, e)
        v, code, empty = v.reshape(-1, len(idx)), code.reshape(-1, len(idx)), (e == s).reshape(-1, len(idx))
        for k, j in enumerate(idx):
            values[columns[j].name] = v[:, k]
            missing[columns[j].name] = empty[:, k]
            if columns[j].required:
                code[:, k][empty[:, k]] = EMPTY
        codes[:, idx] = code
    bad = np.ones(n, dtype=bool)
    bad[lines] = codes.any(axis=1)
    row_of_line = np.full(n, -1, dtype=np.int64)
    row_of_line[lines] = np.arange(lines.size)

    def explain(line: int) -> str:
        if count is not None and count[line] != num_fields:
            return f"expected {num_fields} tab-separated fields, found {count[line]}"
        row = row_of_line[line]
        if row < 0:
            bad_char = int(char[control][np.searchsorted(line_of[control], line)])
            return f"control character 0x{bad_char:02x} in the line" + (" (Windows line ending?)" if bad_char == 13 else "")
        j = int(np.flatnonzero(codes[row])[0])
        text = bytes(buf[starts[row, j]:ends[row, j]]).decode("utf-8", "replace")
        col = columns[j]
        what = {ColumnKind.INT: "a decimal integer", ColumnKind.HEX: "a hexadecimal integer"}[col.kind]
        message = {NOT_NUMBER: f"{text!r} is not {what}", OUT_OF_RANGE: f"{text!r} is out of int64 range",
                   EMPTY: "is empty, and a value is required"}[int(codes[row, j])]
        return f"column {col.name} (field {j + 1}): {message}"

    return ParsedLines(values, missing, lines, bad, explain)
