"""Native parsing of delimited text (TSV, CSV) into a chunk's blocks: one pass over the bytes, GIL released.

``parse_text(data, rows, layout)`` reads ``rows`` lines of ``data`` (each ending in ``\\n``; the last one's is
optional) with one numba ``nogil`` function that splits, checks and converts every field as it goes, so a
loader's threads parse different chunks at the same time. Per field kind:

- ``INT``: ``-?[0-9]+`` within int64; ``HEX``: ``[0-9a-fA-F]+`` up to ``7fffffffffffffff``.
- ``FLOAT``: read as Python's ``float()`` reads the text, correctly rounded. The common short decimals
  (at most 18 significant digits, a power of ten within 10^+-22) are converted here exactly (Clinger's fast
  path: both operands exact, one IEEE operation); anything else (long mantissas, large exponents, ``nan``,
  ``inf``, underscores, spaces) is handed to ``float()`` itself. NaN is a missing value; +-inf is a bad row.
- ``STRING``: the field's bytes (UTF-8) hashed with MurmurHash3_x86_32 and the column's ``hash_seed``, kept as
  the one int64 *key* (low 32 bits zero) whose own 8-byte MurmurHash3 with that seed is the same hash
  (``string_keys``). Hashed like any int64 id, the key lands in the bucket ``ops.hash_buckets`` gives the
  string, so the hash stage (CPU or GPU) needs nothing of its own for strings.
- ``INT_LIST``: decimal integers separated by the list delimiter; an empty field is an empty list.
- fields the layout does not read (``SKIP``: columns of a header that were not declared) are only split.

An empty field is a missing value (0 in the block, flagged in ``missing``). CSV fields may be quoted
(RFC 4180: ``"a,b"``, ``""`` for a quote inside), within one line, and a line may end in ``\\r\\n``.

A bad line is reported, not raised: ``bad[row]`` and a reason naming the column and field, by this priority:
a control character anywhere in the line (any byte below 0x20 but the delimiter, the newline and a tab),
then a malformed quote, then a wrong field count, then the first field (left to right) whose value is wrong.
A bad row's values are 0 (lists empty); its missing flags are all set when the line could not be split, and
are the fields' emptiness otherwise.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import types
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

from ...ops._numba import fast_loading
from ...pipelines.tabular import Column, ColumnKind
from .table_rows import ListColumn
from .text_syntax import CONTROL, DELIM, FLOAT, HEX, INT, KIND_CODES, LIST, NEWLINE, ORD, SKIP, STRING, Layout

# Row and field status codes; FALLBACK: a float the fast path leaves to Python's float().
OK, NOT_NUMBER, OUT_OF_RANGE, EMPTY, NOT_FINITE, NAN_REQUIRED, CONTROL_CHAR, QUOTE_OPEN, QUOTE_AFTER, COUNT, \
    NO_LINE, FALLBACK = range(12)
_QUOTE = 0x22
_MIN_DIV10 = -922337203685477580  # int64's smallest value / 10, rounded towards zero
_INT64_MIN = -(1 << 63)
_MASK32 = 0xFFFFFFFF
# Positions start at this typed zero: a literal 0 would have numba compile each reader once more for it.
_ZERO = np.int64(0)
_POW10 = np.array([10.0 ** k for k in range(23)])  # all exact doubles
_TWO53 = 1 << 53
_HEX_DIGITS = np.full(256, 255, dtype=np.uint8)
_HEX_DIGITS[np.frombuffer(b"0123456789abcdefABCDEF", dtype=np.uint8)] = [*range(16), *range(10, 16)]


class TextChunk(NamedTuple):
    ints: np.ndarray     # [rows, integer columns] int64
    floats: np.ndarray   # [rows, float columns] float64, in the same buffer as ``ints``, right after them
    missing: np.ndarray  # [rows, integer columns + float columns] bool
    lists: dict          # name -> ListColumn
    bad: np.ndarray      # [rows] bool
    reasons: dict        # row -> why it is bad
    exact: bool = True   # whether the data held exactly ``rows`` lines (no line missing, none left over)


# ---- the kernel -----------------------------------------------------------------------------------------------

@njit(nogil=True, cache=True)
def _murmur3(b, start, n, seed):
    """MurmurHash3_x86_32 of b[start:start+n] (int64 arithmetic, masked to 32 bits)."""
    h = seed & _MASK32
    q = start
    for _ in range(n >> 2):
        k = np.int64(b[q]) | (np.int64(b[q + 1]) << 8) | (np.int64(b[q + 2]) << 16) | (np.int64(b[q + 3]) << 24)
        k = (k * 0xCC9E2D51) & _MASK32
        k = ((k << 15) | (k >> 17)) & _MASK32
        k = (k * 0x1B873593) & _MASK32
        h ^= k
        h = ((h << 13) | (h >> 19)) & _MASK32
        h = (h * 5 + 0xE6546B64) & _MASK32
        q += 4
    tail = n & 3
    if tail:
        k = np.int64(0)
        if tail == 3:
            k ^= np.int64(b[q + 2]) << 16
        if tail >= 2:
            k ^= np.int64(b[q + 1]) << 8
        k ^= np.int64(b[q])
        k = (k * 0xCC9E2D51) & _MASK32
        k = ((k << 15) | (k >> 17)) & _MASK32
        k = (k * 0x1B873593) & _MASK32
        h ^= k
    h ^= n & _MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _MASK32
    h ^= h >> 16
    return h


# Modular inverses (mod 2^32) of MurmurHash3's multipliers, to run its 8-byte rounds backwards.
_C1_INV, _C2_INV, _FIVE_INV, _F1_INV, _F2_INV = 0xDEE13BB1, 0x56ED309B, 0xCCCCCCCD, 0xA5CB9243, 0x7ED1B41D


@njit(nogil=True, cache=True)
def _string_key(h, seed):
    """The int64 whose 8 little-endian bytes hash (MurmurHash3_x86_32, ``seed``) to ``h``, among those with
    their low 32 bits zero: there is exactly one, found by running the hash's rounds backwards. So a string
    column's key, hashed like any int64 id, lands where the string itself would."""
    h &= _MASK32
    h ^= h >> 16  # fmix, inverted
    h = (h * _F2_INV) & _MASK32
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _F1_INV) & _MASK32
    h ^= h >> 16
    h ^= 8  # the key's length
    s1 = seed & _MASK32  # the first block, zero, leaves the state at rotl(seed, 13) * 5 + n
    s1 = ((s1 << 13) | (s1 >> 19)) & _MASK32
    s1 = (s1 * 5 + 0xE6546B64) & _MASK32
    x = ((h - 0xE6546B64) * _FIVE_INV) & _MASK32
    x = ((x >> 13) | (x << 19)) & _MASK32
    m = x ^ s1  # the second block, mixed
    m = (m * _C2_INV) & _MASK32
    m = ((m >> 15) | (m << 17)) & _MASK32
    k = (m * _C1_INV) & _MASK32
    return np.int64(k) << 32  # wraps into the sign bit as the bytes say


@njit(nogil=True, cache=True)
def string_keys(offsets, data, seed, out):
    """``out[i]``: the key (see ``_string_key``) of string ``data[offsets[i]:offsets[i + 1]]`` with ``seed``."""
    for i in range(out.size):
        out[i] = _string_key(_murmur3(data, offsets[i], offsets[i + 1] - offsets[i], seed), seed)


@njit(nogil=True, cache=True)
def hex_strings(offsets, data, values, status):
    """Strings ``data[offsets[i]:offsets[i + 1]]`` as hexadecimal ids, like ``HEX`` fields: ``values[i]`` and
    ``status[i]`` (OK, NOT_NUMBER or OUT_OF_RANGE; an empty string is OK with 0, for the caller to call
    missing)."""
    for i in range(values.size):
        q, end = offsets[i], offsets[i + 1]
        while q < end and data[q] == 0x30:  # leading zeros
            q += 1
        v = np.int64(0)
        code = OK
        if end - q > 16 or (end - q == 16 and _HEX_DIGITS[data[q]] >= 8 and _HEX_DIGITS[data[q]] < 16):
            code = OUT_OF_RANGE
        for k in range(q, end):
            d = np.int64(_HEX_DIGITS[data[k]])
            if d >= 16:
                code = NOT_NUMBER
                break
            v = v * 16 + d
        values[i] = 0 if code != OK else v
        status[i] = code


@njit(nogil=True, cache=True, inline="always")
def _field_end(b, q, classes):
    while classes[b[q]] == ORD:
        q += 1
    return q


@njit(nogil=True, cache=True, inline="always")
def _decimal(b, q, classes, stop):
    """An optionally negative decimal integer from b[q] up to a byte of another class or ``stop`` (-1: none)
    -> (end, value, status)."""
    negative = b[q] == 0x2D
    if negative:
        q += 1
    first = q
    acc = np.int64(0)
    while True:
        d = np.int64(b[q]) - 48
        if d < 0 or d > 9:
            break
        acc = acc * 10 - d  # negatively, so that int64's smallest value fits; checked below past 18 digits
        q += 1
    c = b[q]
    if classes[c] != ORD or c == stop:
        if q == first:
            return q, np.int64(0), NOT_NUMBER  # "-" alone (an empty field never gets here)
        if q - first > 18:
            acc, status = _long_decimal(b, first, q)
            if status == OK and not negative:
                if acc == _INT64_MIN:
                    return q, np.int64(0), OUT_OF_RANGE  # 2**63 without a minus sign
            return q, (acc if negative else -acc), status
        return q, (acc if negative else -acc), OK
    while classes[b[q]] == ORD and b[q] != stop:
        q += 1
    return q, np.int64(0), NOT_NUMBER


@njit(nogil=True, cache=True, inline="always")
def _long_decimal(b, q, end):
    """The digits b[q:end] accumulated negatively with a range check -> (value, status)."""
    acc = np.int64(0)
    while q < end:
        d = np.int64(b[q]) - 48
        if acc < _MIN_DIV10 or (acc == _MIN_DIV10 and d > 8):
            return np.int64(0), OUT_OF_RANGE
        acc = acc * 10 - d
        q += 1
    return acc, OK


@njit(nogil=True, cache=True, inline="always")
def _hex(b, q, classes, digits):
    """Hex digits from b[q] (``digits``: each byte's value, 16 and above for a non-digit) -> (end, value,
    status)."""
    first = q
    v = np.int64(0)
    while True:
        d = np.int64(digits[b[q]])
        if d >= 16:
            break
        v = v * 16 + d  # exact up to 15 digits; longer fields are checked below
        q += 1
    if classes[b[q]] != ORD:
        if q - first > 15:
            while first < q and b[first] == 0x30:  # leading zeros
                first += 1
            if q - first > 16 or (q - first == 16 and digits[b[first]] >= 8):
                return q, np.int64(0), OUT_OF_RANGE
            v = np.int64(0)
            while first < q:
                v = v * 16 + np.int64(digits[b[first]])
                first += 1
        return q, v, OK
    return _field_end(b, q, classes), np.int64(0), NOT_NUMBER


@njit(nogil=True, cache=True)
def _float(b, q, classes, pow10):
    """Clinger's fast path for ``[+-]?digits[.digits][(e|E)[+-]digits]`` -> (end, value, status); FALLBACK
    when the text is anything else or the value cannot be had exactly with one IEEE operation."""
    c = b[q]
    negative = c == 0x2D
    if negative or c == 0x2B:
        q += 1
    mantissa = np.int64(0)
    significant = 0   # digits taken into the mantissa, from the first non-zero one
    digits = 0
    exponent = 0
    exact = True
    while True:
        d = np.int64(b[q]) - 48
        if d < 0 or d > 9:
            break
        digits += 1
        if mantissa or d:
            if significant < 18:
                mantissa = mantissa * 10 + d
                significant += 1
            else:
                exact = False
        q += 1
    if b[q] == 0x2E:
        q += 1
        while True:
            d = np.int64(b[q]) - 48
            if d < 0 or d > 9:
                break
            digits += 1
            if mantissa or d:
                if significant < 18:
                    mantissa = mantissa * 10 + d
                    significant += 1
                    exponent -= 1
                else:
                    exact = False
            else:
                exponent -= 1
            q += 1
    if digits == 0:
        return _field_end(b, q, classes), 0.0, FALLBACK
    c = b[q]
    if c == 0x65 or c == 0x45:
        q += 1
        c = b[q]
        sign = 1
        if c == 0x2D or c == 0x2B:
            sign = -1 if c == 0x2D else 1
            q += 1
        e = 0
        edigits = 0
        while True:
            d = np.int64(b[q]) - 48
            if d < 0 or d > 9:
                break
            if e < 100000:
                e = e * 10 + d
            edigits += 1
            q += 1
        if edigits == 0:
            return _field_end(b, q, classes), 0.0, FALLBACK
        exponent += sign * e
    if classes[b[q]] != ORD:
        if mantissa == 0:
            return q, (-0.0 if negative else 0.0), OK
        if exact and mantissa <= _TWO53 and -22 <= exponent <= 22:
            value = np.float64(mantissa)
            value = value * pow10[exponent] if exponent >= 0 else value / pow10[-exponent]
            return q, (-value if negative else value), OK
        return q, 0.0, FALLBACK
    return _field_end(b, q, classes), 0.0, FALLBACK


@njit(nogil=True, cache=True)
def _list(b, q, classes, list_delimiter, values, count):
    """Decimal integers separated by ``list_delimiter`` from b[q] -> (end, new count, status); an empty
    element is not a number."""
    while True:
        q, v, status = _decimal(b, q, classes, list_delimiter)
        if status != OK:
            if b[q] == list_delimiter:  # the rest of the field still has to be passed
                q = _field_end(b, q, classes)
            return q, count, status
        values[count] = v
        count += 1
        if b[q] != list_delimiter:
            return q, count, OK
        q += 1


@njit(nogil=True, cache=True)
def _value(b, q, kind, slot, seed, row, classes, hex_digits, list_delimiter, pow10, ints, floats, lists, list_counts):
    """The value of the non-empty field starting at b[q] into its block -> (end, status)."""
    if kind == INT:
        q, v, status = _decimal(b, q, classes, -1)
        ints[row, slot] = v
    elif kind == HEX:
        q, v, status = _hex(b, q, classes, hex_digits)
        ints[row, slot] = v
    elif kind == STRING:
        end = _field_end(b, q, classes)
        ints[row, slot] = _string_key(_murmur3(b, q, end - q, seed), seed)
        q, status = end, OK
    elif kind == FLOAT:
        q, f, status = _float(b, q, classes, pow10)
        floats[row, slot] = f
    elif kind == LIST:
        q, count, status = _list(b, q, classes, list_delimiter, lists[slot], list_counts[slot])
        list_counts[slot] = count
    else:
        q, status = _field_end(b, q, classes), OK
    return q, status


@njit(nogil=True, cache=True)
def _quoted(b, q, kind, slot, seed, row, classes, crlf, hex_digits, list_delimiter, pow10, ints, floats, lists,
            list_counts, scratch, unquoted):
    """The quoted field at b[q] into its block -> (the byte after it, status); QUOTE_OPEN (or a control character
    inside) and text after the closing quote are reported as QUOTE_OPEN, for _split to explain. The content is
    written into ``scratch`` and read back through ``unquoted``, the same memory seen read-only like ``b``, so
    that the field readers compile once for both."""
    after, n, quoted = _unquote(b, q, classes, crlf, scratch)
    if quoted != OK or classes[b[after]] == ORD:
        return after, QUOTE_OPEN
    if n == 0:
        return after, EMPTY
    if kind == STRING:  # the whole content, delimiters inside included
        ints[row, slot] = _string_key(_murmur3(unquoted, _ZERO, n, seed), seed)
        return after, OK
    if kind == SKIP:
        return after, OK
    end, status = _value(unquoted, _ZERO, kind, slot, seed, row, classes, hex_digits, list_delimiter, pow10, ints, floats,
                         lists, list_counts)
    if end != n and status == OK:  # the content holds a delimiter
        status = FALLBACK if kind == FLOAT else NOT_NUMBER
    return after, status


@njit(nogil=True, cache=True)
def _unquote(b, q, classes, crlf, scratch):
    """The quoted field at b[q] (a quote) -> (position after the closing quote, content length in
    ``scratch`` followed by a newline, status: OK, QUOTE_OPEN or CONTROL_CHAR)."""
    q += 1
    n = 0
    while True:
        c = b[q]
        if c == _QUOTE:
            if b[q + 1] == _QUOTE:
                scratch[n] = _QUOTE
                n += 1
                q += 2
                continue
            scratch[n] = 0x0A
            return q + 1, n, OK
        cls = classes[c]
        if cls == NEWLINE or (crlf and c == 0x0D and b[q + 1] == 0x0A):
            return q, n, QUOTE_OPEN
        if cls == CONTROL:
            return q, n, CONTROL_CHAR
        scratch[n] = c
        n += 1
        q += 1


@njit(nogil=True, cache=True)
def _split(b, q, classes, delimiter, quoting, crlf):
    """Split the line starting at b[q] without converting anything, to explain why it could not be parsed
    -> (start of the next line, fields, first control character's position or -1, first quote problem:
    (code, field, start, end) or code OK)."""
    fields = 1
    control = -1
    quote_code, quote_field, quote_start, quote_end = OK, -1, -1, -1
    at_start = True
    while True:
        c = b[q]
        if quoting and at_start and c == _QUOTE:
            s = q
            q += 1
            closed = False
            while True:
                c = b[q]
                if c == _QUOTE:
                    if b[q + 1] == _QUOTE:
                        q += 2
                        continue
                    q += 1
                    closed = True
                    break
                if classes[c] == NEWLINE or (crlf and c == 0x0D and b[q + 1] == 0x0A):
                    break
                if classes[c] == CONTROL and control < 0:
                    control = q
                q += 1
            if not closed and quote_code == OK:
                quote_code, quote_field, quote_start, quote_end = QUOTE_OPEN, fields - 1, s, q
            elif closed and classes[b[q]] == ORD and quote_code == OK:
                quote_code, quote_field, quote_start, quote_end = QUOTE_AFTER, fields - 1, s, \
                    _field_end(b, q, classes)
            at_start = False
            continue
        cls = classes[c]
        if cls == NEWLINE:
            return q + 1, fields, control, quote_code, quote_field, quote_start, quote_end
        if cls == DELIM:
            fields += 1
            at_start = True
        else:
            at_start = False
            if cls == CONTROL and control < 0 and not (crlf and c == 0x0D and b[q + 1] == 0x0A):
                control = q
        q += 1


# SWAR: up to 8 ASCII digits in one little-endian word (a field's last character in its top byte).
_U = np.uint64
_HIGH_BITS = _U(0x8080808080808080)
_LOW_NIBBLES = _U(0x0F0F0F0F0F0F0F0F)
_LOWER_CASE = _U(0x2020202020202020)
_BYTE_ONES = _U(0x0101010101010101)
_LANES_8, _LANES_16, _LANES_32 = _U(0x00FF00FF00FF00FF), _U(0x0000FFFF0000FFFF), _U(0x00000000FFFFFFFF)
_BELOW_0, _ABOVE_9 = _U((0x80 - 0x30) * 0x0101010101010101), _U((0x7F - 0x39) * 0x0101010101010101)
_BELOW_A, _ABOVE_F = _U((0x80 - 0x61) * 0x0101010101010101), _U((0x7F - 0x66) * 0x0101010101010101)
_KEEP = np.array([((1 << 64) - 1) ^ ((1 << (8 * (8 - n))) - 1) for n in range(9)], dtype=np.uint64)
_S4, _S6, _S8, _S16, _S32 = _U(4), _U(6), _U(8), _U(16), _U(32)
_U9, _U10, _U100, _U10000, _U0, _U1 = _U(9), _U(10), _U(100), _U(10000), _U(0), _U(1)
_ALL = _U(0xFFFFFFFFFFFFFFFF)


@intrinsic
def _word_at(typingctx, data, at):
    """The 8 bytes data[at:at + 8] (uint8 array) as one little-endian word: one unaligned load, its address
    the data's plus ``at``."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.bitcast(builder.gep(array.data, [args[1]]), ir.IntType(64).as_pointer())
        return builder.load(address, align=1)
    return types.uint64(data, types.int64), codegen


@intrinsic
def _pick(typingctx, condition, a, b):
    """``a if condition else b`` without a branch: a select the compiler is told is unpredictable (LLVM would
    otherwise turn one whose operand is a load into a branch, mispredicted where the data decides)."""
    def codegen(context, builder, signature, args):
        choice = builder.select(args[0], args[1], args[2])
        choice.set_metadata("unpredictable", builder.module.add_metadata([]))
        return choice
    return a(condition, a, b), codegen


@njit(nogil=True, cache=True, inline="always")
def _digits_word(x, keep):
    """Whether every kept byte of ``x`` is an ASCII digit; their value (zero bytes below them)."""
    kept = keep & _HIGH_BITS
    ok = ((x & _HIGH_BITS) | (kept & ~((x + _BELOW_0) & ~(x + _ABOVE_9)))) == _U0
    d = x & _LOW_NIBBLES
    d = (d * _U10 + (d >> _S8)) & _LANES_8
    d = (d * _U100 + (d >> _S16)) & _LANES_16
    d = (d * _U10000 + (d >> _S32)) & _LANES_32
    return ok, np.int64(d)


@njit(nogil=True, cache=True, inline="always")
def _hex_word(x, keep):
    """Whether every kept byte of ``x`` is an ASCII hex digit; their value."""
    kept = keep & _HIGH_BITS
    y = x | _LOWER_CASE
    hits = ((x + _BELOW_0) & ~(x + _ABOVE_9)) | ((y + _BELOW_A) & ~(y + _ABOVE_F))  # (y: 0x10-0x19 too)
    ok = ((x & _HIGH_BITS) | (kept & ~hits)) == _U0
    n = (x & _LOW_NIBBLES) + ((x >> _S6) & _BYTE_ONES) * _U9
    n = ((n << _S4) + (n >> _S8)) & _LANES_8  # (as _digits_word's, times 16)
    n = ((n << _S8) + (n >> _S16)) & _LANES_16
    n = ((n << _S16) + (n >> _S32)) & _LANES_32
    return ok, np.int64(n)


@intrinsic
def _ends_at(typingctx, data, at, delimiter):
    """Bit k set where data[at + k] (k < 64) is a byte that ends a field, one a layout's ``classes`` does not
    call ORD: the delimiter, or a byte below 0x20 other than a tab (the newline, a control character). One
    vector load and compare (data[at:at + 64] must be in the array)."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        lanes, i32 = ir.VectorType(ir.IntType(8), 64), ir.IntType(32)
        v = builder.load(builder.bitcast(builder.gep(array.data, [args[1]]), lanes.as_pointer()), align=1)
        d = context.cast(builder, args[2], signature.args[2], types.uint8)
        undefined = ir.Constant(lanes, ir.Undefined)
        d = builder.shuffle_vector(builder.insert_element(undefined, d, ir.Constant(i32, 0)), undefined,
                                   ir.Constant(ir.VectorType(i32, 64), [0] * 64))  # in every lane
        below_space = builder.icmp_unsigned("<", v, ir.Constant(lanes, [0x20] * 64))
        not_tab = builder.icmp_unsigned("!=", v, ir.Constant(lanes, [0x09] * 64))
        hits = builder.or_(builder.and_(below_space, not_tab), builder.icmp_unsigned("==", v, d))
        return builder.bitcast(hits, ir.IntType(64))
    return types.uint64(data, types.int64, delimiter), codegen


@njit(nogil=True, cache=True)
def _last_ends(b, at, classes):
    """``_ends_at`` of the data's last bytes, fewer than 64 (no bit past the end)."""
    hits = _U0
    for k in range(b.size - at):
        if classes[b[at + k]] != ORD:
            hits |= _U1 << _U(k)
    return hits


# The field ends of the 64-byte blocks ahead: block i (b[64 i:64 i + 64]) at ends[i & _RING]. Before each line
# the reader has at least _AHEAD / 2 blocks from the line's start on there, computed _AHEAD / 2 or more at a
# time (and more within a longer line).
_RING, _AHEAD = 255, 128


@njit(nogil=True, cache=True)
def _ends_ahead(b, ends, start, stop, delimiter, classes):
    """Blocks ``start`` to ``stop`` into ``ends`` (those past the data's end: no bit) -> ``stop``."""
    whole = b.size >> 6
    for i in range(start, stop):
        if i < whole:
            hits = _ends_at(b, i << 6, delimiter)
        elif i << 6 < b.size:
            hits = _last_ends(b, i << 6, classes)
        else:
            hits = _U0
        ends[i & _RING] = hits
    return stop


@njit(nogil=True, cache=True, inline="always")
def _empty(kind, row, slot, ints, floats, missing):
    """An empty field's value (0) and missing flag into its block."""
    if kind == INT or kind == HEX or kind == STRING:
        ints[row, slot] = 0
        missing[row, slot] = True
    elif kind == FLOAT:
        floats[row, slot] = 0.0
        missing[row, ints.shape[1] + slot] = True


@njit(nogil=True, cache=True)
def _careful_line(b, q, row, kinds, slots, seeds, required, classes, hex_digits, delimiter, quoting, crlf,
                  list_delimiter, pow10, ints, floats, missing, lists, list_counts, err_field, err_start, err_end,
                  fallback, fallbacks, scratch, unquoted):
    """The line at b[q], every field checked and explained -> (the next line's start, status, fallbacks)."""
    num_fields = kinds.size
    num_ints = ints.shape[1]
    line_start = q
    first_fallback = fallbacks
    status = OK
    split = True  # the line's fields were found; False: a structural problem, explained by _split
    for j in range(num_fields):
        kind = kinds[j]
        slot = slots[j]
        start = q
        c = b[q]
        if classes[c] != ORD:
            field_status = EMPTY
        elif quoting and c == _QUOTE:
            q, field_status = _quoted(b, q, kind, slot, seeds[j], row, classes, crlf, hex_digits, list_delimiter,
                                      pow10, ints, floats, lists, list_counts, scratch, unquoted)
            if field_status == QUOTE_OPEN:
                split = False
                break
            if kind != SKIP and kind != LIST and field_status != EMPTY:
                missing[row, slot if kind != FLOAT else num_ints + slot] = False
        else:
            q, field_status = _value(b, q, kind, slot, seeds[j], row, classes, hex_digits, list_delimiter, pow10,
                                     ints, floats, lists, list_counts)
            if kind != SKIP and kind != LIST:
                missing[row, slot if kind != FLOAT else num_ints + slot] = False
        if field_status == EMPTY:
            _empty(kind, row, slot, ints, floats, missing)
            field_status = EMPTY if required[j] else OK
        elif field_status == FALLBACK:
            fallback[fallbacks, 0] = row
            fallback[fallbacks, 1] = j
            fallback[fallbacks, 2] = slot
            fallback[fallbacks, 3] = start
            fallback[fallbacks, 4] = q
            fallback[fallbacks, 5] = 1 if quoting and b[start] == _QUOTE else 0
            fallbacks += 1
            field_status = OK
        if field_status != OK and status == OK:
            status = field_status
            err_field[row] = j
            err_start[row] = start
            err_end[row] = q
        c = b[q]
        cls = classes[c]
        if j + 1 < num_fields:
            if cls != DELIM:
                split = False
                break
            q += 1
        elif cls == NEWLINE:
            q += 1
        elif crlf and c == 0x0D and b[q + 1] == 0x0A:
            q += 2
        else:
            split = False
    if not split:
        q, count, control, quote_code, quote_field, quote_start, quote_end = _split(
            b, line_start, classes, delimiter, quoting, crlf)
        if control >= 0:
            status, err_start[row] = CONTROL_CHAR, control
        elif quote_code != OK:
            status, err_field[row], err_start[row], err_end[row] = quote_code, quote_field, quote_start, quote_end
        else:
            status, err_start[row] = COUNT, count
        missing[row, :] = True
        fallbacks = first_fallback
    return q, status, fallbacks


@njit(nogil=True, cache=True)
def _parse(b, rows, kinds, slots, seeds, required, classes, hex_digits, delimiter, quoting, crlf,
           list_delimiter, pow10, ints, floats, missing, list_offsets, lists, err, err_field, err_start, err_end,
           fallback, scratch, unquoted, keep):
    """Every line into the blocks; per row ``err`` (a status code), the field at fault and a span (a field's
    bytes, a control character's position, or the field count in ``err_start``). ``fallback``: [k, 0..5] =
    row, field, slot, start, end, quoted, for the floats left to Python; returns how many, and where the last
    line read ends (every line read ends just past its first newline).

    A line from the 8th byte on is first read fast, for when every field is well formed and unquoted; when
    anything is off, ``_careful_line`` reads it again. The fields' ends are the bits of ``ends`` (64-byte
    blocks, those up to ``ready`` computed), taken lowest first, the next block's without a branch when a
    block's are used up: a field's end comes from the last one's with a few bit operations, not from a search
    through its bytes, so that the fields' conversions do not wait on each other. An integer or hex field of
    up to 8 bytes is then read with the word ending at its end and its value and check with SWAR
    (``_digits_word``, ``_hex_word``), without a branch on its length or emptiness; a byte that is not a digit
    (a quote) fails the check. (This is written out here, not as a function numba inlines: an inlined
    function takes a reference to each array it is given, atomic increments and decrements on every line.)"""
    num_fields = kinds.size
    num_ints = ints.shape[1]
    num_lists = list_offsets.shape[0]
    list_counts = np.zeros(max(num_lists, 1), dtype=np.int64)
    ends = np.empty(_RING + 1, dtype=np.uint64)
    ready = _ZERO  # blocks of ``ends`` computed (those from ready - _RING - 1 on are there)
    fallbacks = _ZERO
    end_of_data = b.size
    q = _ZERO
    for row in range(rows):
        if q >= end_of_data:
            err[row] = NO_LINE
            missing[row, :] = True
            for k in range(num_lists):
                list_offsets[k, row + 1] = list_counts[k]
            continue
        good = q >= 8
        s = q
        if good:
            block = q >> 6
            if ready - block < _AHEAD // 2:
                ready = _ends_ahead(b, ends, max(ready, block), block + _AHEAD, delimiter, classes)
            hits = ends[block & _RING] & (_ALL << _U(q & 63))
            bad = False
            for j in range(num_fields):
                used_up = hits == _U0
                block += np.int64(used_up)
                hits = _pick(used_up, ends[block & _RING], hits)
                while (hits == _U0) | (block >= ready):  # a block with no end, or past those computed
                    if (hits == _U0) & (block < ready):
                        block += 1
                    if block >= ready:
                        if block << 6 >= end_of_data:
                            break
                        ready = _ends_ahead(b, ends, ready, block + _AHEAD, delimiter, classes)
                    hits = ends[block & _RING]
                if block >= ready:  # past the data's end
                    good = False
                    break
                e = (block << 6) + np.int64(trailing_zeros(hits))
                hits &= hits - _U1
                kind = kinds[j]
                length = e - s
                if (kind == INT or kind == HEX) and length <= 8:
                    # (indices unsigned where they cannot be negative: no wrap-around of a negative one to compute)
                    x = _word_at(b, e - 8)  # the field in its top bytes
                    slot = _U(slots[j])
                    if kind == INT:
                        negative = (b[_U(s)] == 0x2D) & (length > 0)  # (b[s]: the delimiter when empty)
                        digits = length - np.int64(negative)
                        kept = keep[_U(digits)]
                        ok, v = _digits_word(x & kept, kept)
                        ok = ok & ((digits > 0) | (length == 0))
                        v = -v if negative else v
                    else:
                        kept = keep[_U(length)]
                        ok, v = _hex_word(x & kept, kept)
                    empty = length == 0
                    bad |= (not ok) | (empty & required[j])
                    ints[row, slot] = v
                    missing[row, slot] = empty
                    s = e + 1
                    c = b[_U(e)]
                    if j + 1 < num_fields:
                        if c != delimiter:
                            good = False
                            break
                    elif c != 0x0A and not (crlf and c == 0x0D and b[_U(s)] == 0x0A):
                        good = False
                        break
                    continue
                # any other kind (a float, a string, a list, a field not read, an integer or id over 8 bytes)
                cls = classes[b[e]]
                if j + 1 < num_fields:
                    if cls != DELIM:
                        good = False
                        break
                elif cls != NEWLINE and not (crlf and b[e] == 0x0D and b[e + 1] == 0x0A):
                    good = False
                    break
                slot = slots[j]
                if length == 0:
                    if required[j]:
                        good = False
                        break
                    _empty(kind, row, slot, ints, floats, missing)
                elif quoting and b[s] == _QUOTE:
                    good = False
                    break
                elif kind == INT:
                    negative = b[s] == 0x2D
                    digits = length - 1 if negative else length
                    if digits == 0:
                        good = False
                        break
                    if digits <= 8:
                        ok, v = _digits_word(_word_at(b, e - 8) & keep[digits], keep[digits])
                    elif digits <= 16:
                        ok, low = _digits_word(_word_at(b, e - 8), keep[8])
                        ok2, high = _digits_word(_word_at(b, e - 16) & keep[digits - 8], keep[digits - 8])
                        ok = ok and ok2
                        v = high * 100000000 + low
                    else:
                        end_, v, status = _decimal(b, s, classes, -1)
                        ok = status == OK and end_ == e
                        if negative:
                            v = -v  # undone below
                    if not ok:
                        good = False
                        break
                    ints[row, slot] = -v if negative else v
                    missing[row, slot] = False
                elif kind == HEX:  # (over 8 bytes)
                    end_, v, status = _hex(b, s, classes, hex_digits)
                    if status != OK or end_ != e:
                        good = False
                        break
                    ints[row, slot] = v
                    missing[row, slot] = False
                elif kind == STRING:
                    ints[row, slot] = _string_key(_murmur3(b, s, length, seeds[j]), seeds[j])
                    missing[row, slot] = False
                elif kind == FLOAT:
                    end_, f, status = _float(b, s, classes, pow10)
                    if status != OK or end_ != e:
                        good = False
                        break
                    floats[row, slot] = f
                    missing[row, num_ints + slot] = False
                elif kind == LIST:
                    end_, count, status = _list(b, s, classes, list_delimiter, lists[slot], list_counts[slot])
                    if status != OK or end_ != e:
                        good = False
                        break
                    list_counts[slot] = count
                s = e + 1
            good = good and not bad
        if good:
            q = s + 1 if classes[b[s - 1]] != NEWLINE else s
            err[row] = OK
        else:
            for k in range(num_lists):
                list_counts[k] = list_offsets[k, row]
            q, status, fallbacks = _careful_line(
                b, q, row, kinds, slots, seeds, required, classes, hex_digits, delimiter, quoting, crlf,
                list_delimiter, pow10, ints, floats, missing, lists, list_counts, err_field, err_start, err_end,
                fallback, fallbacks, scratch, unquoted)
            err[row] = status
            if status != OK:  # (its ints and floats are zeroed by the caller)
                for k in range(num_lists):
                    list_counts[k] = list_offsets[k, row]
        for k in range(num_lists):
            list_offsets[k, row + 1] = list_counts[k]
    return fallbacks, q


# The kernels called from Python load from numba's cache without refreshing numba's whole target context.
_parse, string_keys, hex_strings = fast_loading(_parse), fast_loading(string_keys), fast_loading(hex_strings)

# ---- the Python side ------------------------------------------------------------------------------------------

_warming = threading.Lock()
_warmed = False


def warm_up() -> None:
    """Compile the kernel (or load it from numba's cache) now, once per process: the first compile takes
    seconds, so a source starts this on a thread of its own while it indexes its files."""
    global _warmed
    with _warming:
        if not _warmed:
            parse_text(b"1\n" * 8, 8, Layout((Column("warm_up", ColumnKind.INT),)))
            _warmed = True


_WHAT = {INT: "a decimal integer", HEX: "a hexadecimal integer", FLOAT: "a number"}


def _with_read_only_view(scratch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``scratch`` and the same memory seen read-only (the kernel reads what it unquoted into it as it reads ``b``)."""
    unquoted = scratch.view()
    unquoted.flags.writeable = False
    return scratch, unquoted


_NO_SCRATCH = _with_read_only_view(np.empty(1, dtype=np.uint8))  # where nothing is quoted (never written)
# Where a layout has no list or float columns: its list offsets and values, and the floats left to Python, none
# (no rows: never written; shared, not three arrays made per chunk, each a step holding the GIL)
_NO_LISTS = (np.zeros((0, 1), dtype=np.int64), np.empty((0, 0), dtype=np.int64))
_NO_FALLBACK = np.empty((0, 6), dtype=np.int64)


def parse_text(data: bytes, rows: int, layout: Layout) -> TextChunk:
    """``rows`` lines of ``data`` parsed as ``layout`` says (see the module's docstring)."""
    if not data.endswith(b"\n"):
        data = data + b"\n"
    b = np.frombuffer(data, dtype=np.uint8)
    syntax = layout.syntax
    num_ints, num_floats, num_lists = len(layout.int_columns), len(layout.float_columns), len(layout.list_columns)
    block = np.empty(rows * (num_ints + num_floats), dtype=np.int64)  # the floats right after the ints
    ints = block[:rows * num_ints].reshape(rows, num_ints)
    floats = block[rows * num_ints:].view(np.float64).reshape(rows, num_floats)
    missing = np.empty((rows, num_ints + num_floats), dtype=np.bool_)
    if num_lists:
        list_offsets = np.zeros((num_lists, rows + 1), dtype=np.int64)
        lists = np.empty((num_lists, data.count(layout.list_delimiter.to_bytes(1, "little")) + rows), dtype=np.int64)
    else:  # (shared: no rows, never written)
        list_offsets, lists = _NO_LISTS
    err = np.empty(rows, dtype=np.int8)
    err_field = np.empty(rows, dtype=np.int64)
    err_start = np.empty(rows, dtype=np.int64)
    err_end = np.empty(rows, dtype=np.int64)
    fallback = np.empty((rows * num_floats, 6), dtype=np.int64) if num_floats else _NO_FALLBACK
    scratch, unquoted = _with_read_only_view(np.empty(len(data) + 1, dtype=np.uint8)) if syntax.quoting \
        else _NO_SCRATCH
    fallbacks, end = _parse(b, rows, layout.kinds, layout.slots, layout.seeds, layout.required, layout.classes,
                            _HEX_DIGITS, layout.delimiter, syntax.quoting, syntax.crlf, layout.list_delimiter,
                            _POW10, ints, floats, missing, list_offsets, lists, err, err_field, err_start, err_end,
                            fallback, scratch, unquoted, _KEEP)
    if fallbacks:
        _python_floats(data, layout, fallback[:fallbacks], floats, missing, err, err_field, err_start, err_end)
    bad = err != OK
    reasons = {}
    any_bad = bool(np.count_nonzero(bad))  # (no ``bad.any()``: a Python wrapper of ~1.5 us)
    if any_bad:
        rows_bad = np.flatnonzero(bad)
        ints[rows_bad] = 0
        floats[rows_bad] = 0.0
        reasons = {int(r): _reason(data, layout, int(err[r]), int(err_field[r]), int(err_start[r]),
                                   int(err_end[r])) for r in rows_bad}
    columns = {}
    for k, c in enumerate(layout.list_columns):
        offsets = list_offsets[k]
        values = lists[k, :offsets[-1]].copy()
        if any_bad:
            offsets, values = _empty_bad_lists(offsets, values, bad)
        columns[c.name] = ListColumn(offsets, values)
    # (a line missing is a bad row: NO_LINE looked for only then)
    exact = end == b.size and not (any_bad and np.count_nonzero(err == NO_LINE))
    return TextChunk(ints, floats, missing, columns, bad, reasons, exact)


def _python_floats(data, layout, fallback, floats, missing, err, err_field, err_start, err_end) -> None:
    """The floats the fast path left: Python's float() of the text (NaN: missing; inf: a bad row)."""
    num_ints = len(layout.int_columns)
    for row, field, slot, start, end, quoted in fallback.tolist():
        text = data[start:end]
        if quoted:
            text = text[1:-1].replace(b'""', b'"')
        try:
            value = float(text.decode("utf-8"))
            status = OK
        except (UnicodeDecodeError, ValueError):
            value, status = 0.0, NOT_NUMBER
        if status == OK and value != value:
            value = 0.0
            missing[row, num_ints + slot] = True
            status = NAN_REQUIRED if layout.required[field] else OK
        elif status == OK and value in (float("inf"), float("-inf")):
            status = NOT_FINITE
        floats[row, slot] = value
        if status != OK and (err[row] == OK or (err[row] in (NOT_NUMBER, OUT_OF_RANGE, EMPTY, NOT_FINITE, NAN_REQUIRED)
                                                and err_field[row] > field)):
            err[row], err_field[row], err_start[row], err_end[row] = status, field, start, end


def _empty_bad_lists(offsets: np.ndarray, values: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)
    if not lengths[bad].any():
        return offsets, values
    keep = np.repeat(~bad, lengths)
    lengths[bad] = 0
    new = np.zeros_like(offsets)
    np.cumsum(lengths, out=new[1:])
    return new, values[keep]


def _reason(data: bytes, layout: Layout, code: int, field: int, start: int, end: int) -> str:
    syntax = layout.syntax
    if code == CONTROL_CHAR:
        char = data[start]
        return f"control character 0x{char:02x} in the line" + (" (Windows line ending?)" if char == 0x0D else "")
    if code == COUNT:
        return f"expected {layout.kinds.size} {syntax.delimiter_name}-separated fields, found {start}"
    if code == NO_LINE:
        return "the chunk ends before this line (did the file change while it was read?)"
    # (a quote can go wrong in a field past the last one the line should have)
    where = f"column {layout.names[field]} (field {field + 1}): " if field < len(layout.names) else \
        f"field {field + 1}: "
    text = data[start:end].decode("utf-8", "replace")
    if code == QUOTE_OPEN:
        return where + "a quoted field has no closing quote on its line"
    if code == QUOTE_AFTER:
        return where + f"{text!r} has text after its closing quote"
    if code == EMPTY:
        return where + "is empty, and a value is required"
    if code == NAN_REQUIRED:
        return where + f"{text!r} is NaN (a missing value), and a value is required"
    if code == NOT_FINITE:
        return where + f"{text!r} is not a finite number"
    column = layout.fields[field]
    if column.kind is ColumnKind.INT_LIST:
        what = f"a list of decimal integers separated by {syntax.list_delimiter!r}"
        if code == OUT_OF_RANGE:
            return where + f"{text!r} has an element out of int64 range"
        return where + f"{text!r} is not {what}"
    if code == OUT_OF_RANGE:
        return where + f"{text!r} is out of int64 range"
    return where + f"{text!r} is not {_WHAT[KIND_CODES[column.kind]]}"
