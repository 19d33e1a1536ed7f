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

from ...pipelines.tabular import ColumnKind, Column

PAD = 8  # filler before the first line, so an 8-byte word ending at any field starts inside the buffer
_FILLER = b"0" * (PAD - 1)

_U = np.uint64
_HIGH_BITS = _U(0x8080808080808080)
_LOWER_CASE = _U(0x2020202020202020)
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_BYTE_ONES = _U(0x0101010101010101)
_LANES_8 = _U(0x00FF00FF00FF00FF)
_LANES_16 = _U(0x0000FFFF0000FFFF)
_LANES_32 = _U(0x00000000FFFFFFFF)
# _KEEP[n]: the top n bytes of a word, that is the last n characters before the field's end.
_KEEP = np.array([((1 << 64) - 1) ^ ((1 << (8 * (8 - n))) - 1) for n in range(9)], dtype=np.uint64)
_INT64_MAX = (1 << 63) - 1
BLOCK = 1 << 15  # fields converted at a time, so the temporaries stay in cache

OK, NOT_NUMBER, OUT_OF_RANGE, EMPTY = 0, 1, 2, 3


def join_lines(pieces: list) -> np.ndarray:
    """A line buffer from byte strings without their newlines."""
    return np.frombuffer(b"\n".join([_FILLER, *pieces, b""]), dtype=np.uint8)


def _words(buf: np.ndarray) -> np.ndarray:
    """word[i] = the 8 bytes buf[i:i+8] as a little-endian uint64 (an unaligned view, no copy)."""
    return np.ndarray((buf.size - 7,), dtype="<u8", buffer=buf, strides=(1,))


def _in_range(x: np.ndarray, low: int, high: int) -> np.ndarray:
    """Per byte of words whose bytes are all below 0x80: 0x80 where low <= byte <= high, else 0."""
    return (x + _U((0x80 - low) * 0x0101010101010101)) & ~(x + _U((0x7F - high) * 0x0101010101010101)) & _HIGH_BITS


def _window(words: np.ndarray, end: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``count`` (0..8) characters before ``end`` in the top bytes of a word, zeros below; and the
    characters' bytes as a mask (``_KEEP[count]``)."""
    keep = _KEEP[count]
    return words[end - 8] & keep, keep


def _all_in(x: np.ndarray, keep: np.ndarray, ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Whether every kept byte of ``x`` lies in one of ``ranges``."""
    kept = keep & _HIGH_BITS
    hits = _in_range(x, *ranges[0])
    for r in ranges[1:]:
        hits |= _in_range(x, *r)
    return ((x & _HIGH_BITS) == 0) & ((hits & kept) == kept)


def _decimal_word(x: np.ndarray) -> np.ndarray:
    """Up to 8 ASCII digits (zero bytes before them) -> their value; SWAR, two digits, then four, then eight."""
    d = x & _LOW_NIBBLES
    t = d >> _U(8); d *= _U(10); d += t; d &= _LANES_8
    t = d >> _U(16); d *= _U(100); d += t; d &= _LANES_16
    t = d >> _U(32); d *= _U(10000); d += t; d &= _LANES_32
    return d


def _hex_word(x: np.ndarray) -> np.ndarray:
    """Up to 8 ASCII hex digits (zero bytes before them) -> their value."""
    n = x & _LOW_NIBBLES
    t = x >> _U(6); t &= _BYTE_ONES; t *= _U(9); n += t  # letters: low nibble + 9
    t = n & _LANES_8; t <<= _U(4); n >>= _U(8); n &= _LANES_8; n |= t
    t = n & _LANES_16; t <<= _U(8); n >>= _U(16); n &= _LANES_16; n |= t
    t = n & _LANES_32; t <<= _U(16); n >>= _U(32); n |= t
    return n


_DIGITS = ((0x30, 0x39),)
_HEX_DIGITS = ((0x30, 0x39), (0x61, 0x66))


def parse_decimal(buf: np.ndarray, start: np.ndarray, end: np.ndarray, check: bool = True, convert: bool = True
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """Fields buf[start:end] as optionally signed decimal int64 -> (values, status codes or None when not
    ``check``ed); an empty field is 0. Without ``convert`` the values are left unset (checking only)."""
    values = np.empty(start.size, dtype=np.int64)
    code = np.zeros(start.size, dtype=np.int8) if check else None
    words = _words(buf)
    for a in range(0, start.size, BLOCK):
        s, e = start[a:a + BLOCK], end[a:a + BLOCK]
        negative = buf[s] == ord("-")  # an empty field's start is its separator, never '-'
        length = e - s - negative
        x, kept = _window(words, e, np.minimum(length, 8))
        v = _decimal_word(x).view(np.int64) if convert else values[a:a + BLOCK]
        if check:
            c = code[a:a + BLOCK]
            c[~_all_in(x, kept, _DIGITS) | (negative & (length == 0))] = NOT_NUMBER
        long = np.flatnonzero(length > 8)
        if long.size:
            el, n = e[long], length[long]
            xm, km = _window(words, el - 8, np.clip(n - 8, 0, 8))
            xh, kh = _window(words, el - 16, np.clip(n - 16, 0, 2))
            v[long] += _decimal_word(xm).view(np.int64) * 10**8 + _decimal_word(xh).view(np.int64) * 10**16
            if check:
                c[long[~(_all_in(xm, km, _DIGITS) & _all_in(xh, kh, _DIGITS))]] = NOT_NUMBER
            slow = long[n > 18]
            _slow(buf, slow, s + negative, e, v, c if check else None, base=10, negative=negative[slow])
        np.negative(v, out=v, where=negative)
        values[a:a + BLOCK] = v
    return values, code


def parse_hex(buf: np.ndarray, start: np.ndarray, end: np.ndarray, check: bool = True, convert: bool = True
              ) -> tuple[np.ndarray, np.ndarray | None]:
    """Fields buf[start:end] as unsigned hexadecimal within int64's range -> (values, status codes or None);
    without ``convert`` the values are left unset."""
    values = np.empty(start.size, dtype=np.int64)
    code = np.zeros(start.size, dtype=np.int8) if check else None
    words = _words(buf)
    for a in range(0, start.size, BLOCK):
        s, e = start[a:a + BLOCK], end[a:a + BLOCK]
        length = e - s
        x, kept = _window(words, e, np.minimum(length, 8))
        v = _hex_word(x).view(np.int64) if convert else values[a:a + BLOCK]
        if check:
            c = code[a:a + BLOCK]
            c[~_all_in(x | _LOWER_CASE, kept, _HEX_DIGITS)] = NOT_NUMBER
        long = np.flatnonzero(length > 8)
        if long.size:
            el, n = e[long], length[long]
            xh, kh = _window(words, el - 8, np.clip(n - 8, 0, 8))
            high = _hex_word(xh)
            v[long] |= (high & _U(0x7FFFFFFF)).view(np.int64) << 32
            if check:
                digits = _all_in(xh | _LOWER_CASE, kh, _HEX_DIGITS)
                c[long[~digits]] = NOT_NUMBER
                c[long[digits & (high >= _U(1 << 31))]] = OUT_OF_RANGE  # only a number can be out of range
            _slow(buf, long[n > 16], s, e, v, c if check else None, base=16)
        values[a:a + BLOCK] = v
    return values, code


_ALL_DIGITS = {10: b"0123456789", 16: b"0123456789abcdefABCDEF"}


def _slow(buf, fields, start, end, values, code, base: int, negative=None) -> None:
    """Fields too long for the word path (19+ digits, or 17+ hex digits): Python ``int``. Rare in practice.
    Digits only (``int`` itself would also take a ``0x`` prefix, underscores or spaces); ``negative``: the
    fields whose '-' the caller took off, for which 2**63 (int64's smallest value once negated) fits."""
    for k, f in enumerate(fields.tolist()):
        text = bytes(buf[start[f]:end[f]])
        value = int(text, base) if text and not text.translate(None, _ALL_DIGITS[base]) else None
        limit = _INT64_MAX + (1 if negative is not None and negative[k] else 0)
        status = NOT_NUMBER if value is None else OUT_OF_RANGE if value > limit else OK
        if status == OK:
            values[f] = value if value <= _INT64_MAX else -value  # -2**63 stays itself when the caller negates
        if code is not None:
            code[f] = status


@dataclass
class ParsedLines:
    """``n`` parsed lines. ``lines``: the lines with the right number of fields, whose columns are in
    ``values``/``missing`` (one entry per such line, in order); ``bad``: every bad line of the ``n`` (without
    ``check``, only lines with a wrong field count)."""

    values: dict[str, np.ndarray]
    missing: dict[str, np.ndarray]
    lines: np.ndarray
    bad: np.ndarray
    _explain: object
    # With ``by_row``: per column kind, its columns' values and missing flags as [lines, columns of the kind]
    # row-major blocks (columns in declaration order), instead of ``values``/``missing`` (left empty).
    blocks: dict = None
    empty: dict = None

    def reason(self, line: int) -> str:
        return self._explain(line)


def _columns(a: np.ndarray, idx: list[int]) -> np.ndarray:
    """Columns ``idx`` of the [lines, fields] matrix ``a``, flattened line by line (so the fields are visited
    in the order they lie in the buffer)."""
    if idx == list(range(idx[0], idx[-1] + 1)):
        return a[:, idx[0]:idx[-1] + 1].ravel()
    return a[:, idx].ravel()


_PARSERS = {ColumnKind.INT: (parse_decimal, "a decimal integer"), ColumnKind.HEX: (parse_hex, "a hexadecimal integer")}


def parse_lines(buf: np.ndarray, n: int, columns: tuple[Column, ...], *, check: bool = True,
                convert: bool = True, by_row: bool = False) -> ParsedLines:
    """Parse a line buffer holding ``n`` lines of ``len(columns)`` tab-separated fields. Without ``check``
    the fields are trusted to be well formed (they were checked when the file was opened); without
    ``convert`` only the checks run and the values are meaningless. With ``by_row`` the values come as one
    row-major block per column kind (``ParsedLines.blocks``/``empty``), as parsed, without transposing."""
    num_fields = len(columns)
    sep = np.flatnonzero(buf[PAD:] < 0x20)
    sep += PAD
    char = buf[sep]
    newline = char == 0x0A
    control = np.flatnonzero((char != 0x09) != newline)  # neither tab nor newline
    # A field starts one past the separator before it (for a line's first field, the previous newline).
    after = np.empty_like(sep)
    after[0] = PAD
    after[1:] = sep[:-1] + 1
    if sep.size == n * num_fields and not control.size and newline[num_fields - 1::num_fields].all():
        ends = sep.reshape(n, num_fields)
        starts = after.reshape(n, num_fields)
        lines = np.arange(n)
        count = None
    else:
        line_of = np.cumsum(newline) - newline
        count = np.bincount(line_of, minlength=n)
        good = count == num_fields
        good[line_of[control]] = False
        keep = good[line_of]
        ends = sep[keep].reshape(-1, num_fields)
        starts = after[keep].reshape(-1, num_fields)
        lines = np.flatnonzero(good)

    values: dict[str, np.ndarray] = {}
    missing: dict[str, np.ndarray] = {}
    blocks: dict = {} if by_row else None
    empties: dict = {} if by_row else None
    bad = np.ones(n, dtype=bool)
    bad[lines] = False
    codes: list[tuple[list[int], np.ndarray]] = []  # per kind: its columns, and [lines, columns] status codes
    for kind, (parse, _) in _PARSERS.items():
        idx = [j for j, c in enumerate(columns) if c.kind is kind]
        if not idx or not lines.size:
            continue
        s, e = _columns(starts, idx), _columns(ends, idx)
        v, code = parse(buf, s, e, check, convert)
        v = v.reshape(-1, len(idx))
        empty = (s == e).reshape(-1, len(idx))
        if by_row:
            blocks[kind], empties[kind] = v, empty
        else:  # one transposed copy per kind, so that every column comes out contiguous
            v, empty_t = np.ascontiguousarray(v.T), np.ascontiguousarray(empty.T)
            for k, j in enumerate(idx):
                values[columns[j].name] = v[k]
                missing[columns[j].name] = empty_t[k]
        if check:
            code = code.reshape(-1, len(idx))
            for k, j in enumerate(idx):
                if columns[j].required:
                    code[:, k][empty[:, k]] = EMPTY
            bad[lines[np.flatnonzero(code) // len(idx)]] = True
            codes.append((idx, code))

    def explain(line: int) -> str:
        if control.size:
            k = np.searchsorted(line_of[control], line)
            if k < control.size and line_of[control[k]] == line:
                bad_char = int(char[control[k]])
                return f"control character 0x{bad_char:02x} in the line" + (
                    " (Windows line ending?)" if bad_char == 0x0D else "")
        if count is not None and count[line] != num_fields:
            return f"expected {num_fields} tab-separated fields, found {count[line]}"
        row = int(np.searchsorted(lines, line))
        status = {j: int(code[row, k]) for idx, code in codes for k, j in enumerate(idx) if code[row, k] != OK}
        j = min(status)
        text = bytes(buf[starts[row, j]:ends[row, j]]).decode("utf-8", "replace")
        col = columns[j]
        message = {NOT_NUMBER: f"{text!r} is not {_PARSERS[col.kind][1]}", OUT_OF_RANGE: f"{text!r} is out of int64 range",
                   EMPTY: "is empty, and a value is required"}[status[j]]
        return f"column {col.name} (field {j + 1}): {message}"

    return ParsedLines(values, missing, lines, bad, explain, blocks, empties)
