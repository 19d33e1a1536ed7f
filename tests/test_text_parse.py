"""The native text parser (loader/sources/text_parse.py) against an independent reference: the documented
format decided in plain Python (regular expressions, ``int``, ``float``, sklearn's MurmurHash3), on random and
mutated lines of every column kind, in TSV and CSV. (Until it was removed, the vectorised NumPy parser this one
replaced was checked against it here too, on random and mutated int and hex lines: the same values, missing
flags, bad rows and reasons, but for one wrong reason of the old parser, fixed below.)"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.utils import murmurhash3_32

from feedline.loader.sources.text_parse import hex_strings, parse_text
from feedline.loader.sources.text_syntax import CSV, TSV, Layout, TextSyntax
from feedline.ops import Strings, hash_buckets, murmur3_32
from feedline.pipelines.tabular import Column, ColumnKind

K = ColumnKind
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_DECIMAL = re.compile(rb"-?[0-9]+")
_HEX = re.compile(rb"[0-9a-fA-F]+")

# ---- the reference ---------------------------------------------------------------------------------------------


def _split_quoted(body: bytes, delimiter: int):
    """RFC 4180 fields of one line: [(content, raw)], or ("bad", (field, code, raw))."""
    fields, i, n = [], 0, len(body)
    while True:
        if i < n and body[i] == 0x22:
            j, content, closed = i + 1, bytearray(), False
            while j < n:
                if body[j] == 0x22:
                    if j + 1 < n and body[j + 1] == 0x22:
                        content.append(0x22)
                        j += 2
                        continue
                    closed = True
                    j += 1
                    break
                content.append(body[j])
                j += 1
            if not closed:
                return "bad", (len(fields), "open", body[i:])
            if j < n and body[j] != delimiter:
                k = body.find(bytes([delimiter]), j)
                return "bad", (len(fields), "after", body[i:n if k < 0 else k])
            fields.append((bytes(content), body[i:j]))
            if j == n:
                return "ok", fields
            i = j + 1
        else:
            k = body.find(bytes([delimiter]), i)
            k = n if k < 0 else k
            fields.append((body[i:k], body[i:k]))
            if k == n:
                return "ok", fields
            i = k + 1


def _integer(text: bytes, pattern, base: int, low: int):
    if not pattern.fullmatch(text):
        return "not"
    value = int(text, base)
    return value if low <= value <= INT64_MAX else "range"


def reference(line: bytes, fields: tuple, syntax: TextSyntax, names: tuple):
    """(values by column name, missing by column name) of a good line, or the reason a bad one is bad.
    ``fields``: the column of each field (None: not read), ``names``: each field's name."""
    body = line[:-1] if syntax.crlf and line.endswith(b"\r") else line
    delimiter = ord(syntax.delimiter)
    controls = [c for c in body if c < 0x20 and c not in (0x09, delimiter)]
    if controls:
        return f"control character 0x{controls[0]:02x} in the line" + (
            " (Windows line ending?)" if controls[0] == 0x0D else "")
    if syntax.quoting:
        verdict, parts = _split_quoted(body, delimiter)
        if verdict == "bad":
            j, code, raw = parts
            where = f"column {names[j]} (field {j + 1}): " if j < len(fields) else f"field {j + 1}: "
            if code == "open":
                return where + "a quoted field has no closing quote on its line"
            return where + f"{raw.decode('utf-8', 'replace')!r} has text after its closing quote"
    else:
        parts = [(p, p) for p in body.split(bytes([delimiter]))]
    if len(parts) != len(fields):
        return f"expected {len(fields)} {syntax.delimiter_name}-separated fields, found {len(parts)}"
    values, missing, problem = {}, {}, None
    for j, ((text, raw), column) in enumerate(zip(parts, fields)):
        if column is None:
            continue
        where = f"column {column.name} (field {j + 1}): "
        shown = repr(raw.decode("utf-8", "replace"))
        kind, why, value, empty = column.kind, None, None, text == b""
        if empty:
            value = [] if kind is K.INT_LIST else 0
            if column.required:
                why = "is empty, and a value is required"
        elif kind in (K.INT, K.HEX):
            value = _integer(text, _DECIMAL if kind is K.INT else _HEX, 10 if kind is K.INT else 16,
                             INT64_MIN if kind is K.INT else 0)
            if value == "not":
                why = f"{shown} is not a {'decimal' if kind is K.INT else 'hexadecimal'} integer"
            elif value == "range":
                why = f"{shown} is out of int64 range"
        elif kind is K.FLOAT:
            try:
                value = float(text.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                why = f"{shown} is not a number"
            else:
                if math.isnan(value):
                    value, empty = 0.0, True
                    if column.required:
                        why = f"{shown} is NaN (a missing value), and a value is required"
                elif math.isinf(value):
                    why = f"{shown} is not a finite number"
        elif kind is K.STRING:
            value = murmurhash3_32(text, column.hash_seed, positive=True)
        else:
            value = [_integer(e, _DECIMAL, 10, INT64_MIN) for e in text.split(syntax.list_delimiter.encode())]
            bad = [e for e in value if isinstance(e, str)]
            if bad:
                why = f"{shown} has an element out of int64 range" if bad[0] == "range" else \
                    f"{shown} is not a list of decimal integers separated by {syntax.list_delimiter!r}"
        if why is not None and problem is None:
            problem = where + why
        values[column.name], missing[column.name] = value, empty
    return problem if problem is not None else (values, missing)


def key_hash(key: int, cols, name: str) -> int:
    """The MurmurHash3 a string column's key stands for: the hash of its 8 little-endian bytes (whose low 4
    are zero)."""
    assert key & 0xFFFFFFFF == 0, key
    seed = next(c.hash_seed for c in cols if c.name == name)
    return murmurhash3_32(key.to_bytes(8, "little", signed=True), seed, positive=True)


def check_against_reference(lines: list[bytes], layout: Layout, final_newline: bool = True) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline or not lines[-1] else b"")  # (an empty last line has one)
    got = parse_text(data, len(lines), layout)
    ints = {c.name: k for k, c in enumerate(layout.int_columns)}
    floats = {c.name: k for k, c in enumerate(layout.float_columns)}
    for r, line in enumerate(lines):
        want = reference(line, layout.fields, layout.syntax, layout.names)
        if isinstance(want, str):
            assert got.bad[r] and got.reasons[r] == want, (line, got.reasons.get(r), want)
            assert not got.ints[r].any() and not got.floats[r].any(), line
            for c in layout.list_columns:
                offsets = got.lists[c.name].offsets
                assert offsets[r + 1] == offsets[r], line  # a bad row's lists are empty
            continue
        assert not got.bad[r], (line, got.reasons.get(r))
        values, missing = want
        for name, k in ints.items():
            assert got.missing[r, k] == missing[name], (line, name)
            value = int(got.ints[r, k])
            if layout.columns[[c.name for c in layout.columns].index(name)].kind is K.STRING and not missing[name]:
                value = key_hash(value, layout.columns, name)
            assert value == values[name], (line, name, got.ints[r, k], values[name])
        for name, k in floats.items():
            assert got.missing[r, len(ints) + k] == missing[name], (line, name)
            value = got.floats[r, k]
            assert value == values[name] and math.copysign(1, value) == math.copysign(1, values[name]), \
                (line, name, value, values[name])
        for c in layout.list_columns:
            col = got.lists[c.name]
            assert col.values[col.offsets[r]:col.offsets[r + 1]].tolist() == values[c.name], (line, c.name)
    assert set(got.reasons) == set(np.flatnonzero(got.bad).tolist())


# ---- lines -------------------------------------------------------------------------------------------------------

decimal_text = st.one_of(
    st.integers(INT64_MIN, INT64_MAX).map(str),
    st.integers(0, 10**25).map(str),
    st.integers(-10**25, 0).map(str),
    st.tuples(st.integers(0, 22), st.integers(0, 10**6)).map(lambda t: "0" * t[0] + str(t[1])),
    st.sampled_from(["9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
                     "-0", "-", "--1", "+1", "1-", "00000000000000000000009223372036854775807"]),
    st.text(alphabet="0123456789-+.eEnaif x:/", min_size=0, max_size=22),
).map(str.encode)
hex_text = st.one_of(
    st.integers(0, 2**64).map(lambda v: format(v, "x")),
    st.integers(0, 2**32).map(lambda v: format(v, "08X")),
    st.tuples(st.integers(0, 20), st.integers(0, 2**40)).map(lambda t: "0" * t[0] + format(t[1], "x")),
    st.sampled_from(["7fffffffffffffff", "8000000000000000", "ffffffffzzzzzzzz", "0" * 30 + "1", "F" * 16]),
    st.text(alphabet="0123456789abcdefABCDEFgxyz-+ G@`/:", min_size=0, max_size=20),
).map(str.encode)
float_text = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(width=32).map(str),
    st.integers(0, 25).flatmap(lambda p: st.decimals(allow_nan=False, allow_infinity=False, places=p)).map(str),
    st.tuples(st.integers(-10**20, 10**20), st.integers(-330, 330)).map(lambda t: f"{t[0]}e{t[1]}"),
    st.tuples(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 12)).map(
        lambda t: f"{t[0]}.{str(t[1]).zfill(t[2])}"),
    st.sampled_from(["nan", "-NaN", "inf", "-Infinity", "1_000.5", " 1.5", "1.5 ", ".5", "5.", ".", "-.5e-3", "1e",
                     "1e+", "0x10", "١٢", "1.7976931348623157e308", "1.8e308", "4.9e-324", "2e-324",
                     "9007199254740993", "0.1", "-0", "-0.0", "123456789012345678901234567890"]),
    st.text(alphabet="0123456789-+.eE_ ni", min_size=0, max_size=12),
).map(lambda t: t.encode())
string_text = st.one_of(st.text(max_size=12).map(lambda t: t.encode("utf-8")),
                        st.binary(max_size=12))
list_text = st.one_of(
    st.lists(st.integers(-2**63, 2**63 - 1), max_size=5).map(lambda v: "|".join(map(str, v))),
    st.lists(st.one_of(st.integers(-10**20, 10**20).map(str), st.sampled_from(["", "-", "x", "1.5"])),
             max_size=4).map("|".join),
).map(str.encode)
TEXT_OF = {K.INT: decimal_text, K.HEX: hex_text, K.FLOAT: float_text, K.STRING: string_text, K.INT_LIST: list_text}
SPECIAL = [b"\t", b",", b"|", b'"', b'""', b"\r", b"\x00", b"\x0b", b"\x1f", b"\x80", b"\xff", b"-", b" ", b"0", b"a"]


@st.composite
def columns(draw, kinds=tuple(K)):
    chosen = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=6))
    return tuple(Column(f"c{j}", kind, required=draw(st.booleans()) and kind is not K.INT_LIST,
                        hash_seed=draw(st.integers(0, 2**32 - 1)) if kind is K.STRING else 0)
                 for j, kind in enumerate(chosen))


def _quote(text: bytes) -> bytes:
    return b'"' + text.replace(b'"', b'""') + b'"'


@st.composite
def line_of(draw, cols: tuple, syntax: TextSyntax):
    """A line of fields of the columns' kinds (for CSV some quoted), then perhaps a few random edits."""
    delimiter = syntax.delimiter.encode()
    fields = []
    for c in cols:
        text = draw(TEXT_OF[c.kind])
        if syntax.quoting and (delimiter in text or b'"' in text or draw(st.integers(0, 5)) == 0):
            text = _quote(text)
        elif not syntax.quoting:
            text = text.replace(delimiter, b"")
        fields.append(text.replace(b"\n", b""))
    line = delimiter.join(fields)
    for _ in range(draw(st.integers(0, 2)) if draw(st.booleans()) else 0):
        at = draw(st.integers(0, len(line)))
        if draw(st.booleans()) and line:
            line = line[:at] + line[at + 1:]
        else:
            line = line[:at] + draw(st.sampled_from(SPECIAL)) + line[at:]
    if syntax.crlf and draw(st.integers(0, 3)) == 0:
        line += b"\r"
    return line.replace(b"\n", b"")


SYNTAXES = {"tsv": TSV, "csv": CSV, "semicolon-unquoted": TextSyntax(delimiter=";", list_delimiter=" "),
            "space-csv": TextSyntax(delimiter=" ", quoting=True, list_delimiter=":")}


@pytest.mark.parametrize("name", sorted(SYNTAXES))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_kind_parses_like_the_reference(name, data):
    syntax = SYNTAXES[name]
    cols = data.draw(columns())
    lines = data.draw(st.lists(line_of(cols, syntax), min_size=1, max_size=12))
    if syntax.list_delimiter != "|":
        lines = [line.replace(b"|", syntax.list_delimiter.encode()) for line in lines]
    check_against_reference(lines, Layout(cols, syntax), final_newline=data.draw(st.booleans()))


@settings(max_examples=100, deadline=None)
@given(cols=columns(), raw=st.lists(st.binary(max_size=40), min_size=1, max_size=8), csv=st.booleans())
def test_random_bytes_never_misparse(cols, raw, csv):
    """Arbitrary bytes (no newline inside a line) are either parsed as the reference parses them or refused
    for the reference's reason."""
    lines = [r.replace(b"\n", b"") for r in raw]
    check_against_reference(lines, Layout(cols, CSV if csv else TSV))


@pytest.mark.parametrize("name", sorted(SYNTAXES))
def test_every_byte_at_every_place_of_a_word(name):
    """The parser finds a line's separators eight bytes at a time: each byte value but the newline, put at each
    place of the first 16 bytes of a good line (so at every place within a word, and across a word's edge), is
    read as the reference reads it: a delimiter, a control character, or part of a field."""
    syntax = SYNTAXES[name]
    cols = (Column("s", K.STRING, hash_seed=3), Column("i", K.INT), Column("h", K.HEX), Column("t", K.STRING))
    good = syntax.delimiter.encode().join([b"abcdefg", b"1234", b"1f2e3d", b"xyz"])
    lines = [good]  # a first line, so that every line below starts past the first word of the chunk
    for byte in range(256):
        if byte != 0x0A:
            lines += [good[:at] + bytes([byte]) + good[at:] for at in range(17)]
    check_against_reference(lines, Layout(cols, syntax))


def test_header_layout_skips_undeclared_fields():
    declared = (Column("b", K.FLOAT), Column("d", K.STRING, hash_seed=7))
    layout = Layout(declared, CSV, fields=(None, declared[0], None, declared[1]), names=("a", "b", "c", "d"))
    lines = [b'x,1.5,"y,z",hello', b'1,2,3', b',,,', b'"a""b",1e3,q,"he said ""hi"""', b'1,2,"3"x,4']
    check_against_reference(lines, layout)
    got = parse_text(b"\n".join(lines), len(lines), layout)
    assert got.reasons == {1: "expected 4 comma-separated fields, found 3",
                           4: "column c (field 3): '\"3\"x' has text after its closing quote"}
    assert got.floats[:, 0].tolist() == [1.5, 0.0, 0.0, 1000.0, 0.0]
    assert murmur3_32(got.ints[3:, 0], seed=7)[0] == murmur3_32(['he said "hi"'], seed=7)[0]


def test_strings_hash_as_ops_hash_buckets():
    """A string column's value is the int64 key whose MurmurHash3 is the string's (UTF-8 bytes, the column's
    seed), so hashed as an id it gets the bucket ``ops.hash_buckets`` gives the string (golden: sklearn's
    murmurhash3_32 of b'abc', seed 3)."""
    words = ["abc", "", "naïve", "日本語テキスト", "a,b", 'q"q', "x" * 37]
    col = Column("s", K.STRING, hash_seed=3)
    text = b"\n".join(_quote(w.encode()) for w in words)
    got = parse_text(text, len(words), Layout((col,), CSV))
    assert not got.bad.any()
    keys = got.ints[:, 0]
    assert murmur3_32(keys[:1], seed=3)[0] == 1193954329 == murmurhash3_32(b"abc", 3, positive=True)
    assert got.missing[:, 0].tolist() == [w == "" for w in words]
    nonempty = [k for k, w in enumerate(words) if w]
    for buckets in (1000, 1 << 20, (1 << 32) - 1):
        expect = hash_buckets(Strings.from_pylist([words[k] for k in nonempty]), buckets, seed=3)
        assert hash_buckets(keys[nonempty], buckets, seed=3).tolist() == expect.tolist()


def test_floats_are_correctly_rounded():
    """The fast path's results equal Python's float() on many random short decimals (bit for bit), and the
    texts it cannot do exactly are handed to float()."""
    rng = np.random.default_rng(5)
    mant = rng.integers(0, 10 ** rng.integers(1, 19, 20000))  # up to 18 digits: beyond 2**53 too
    scale = rng.integers(0, 19, 20000)
    exps = rng.integers(-30, 30, 20000)
    texts = [f"{m / 10**s:.{s}f}" for m, s in zip(mant.tolist(), scale.tolist())]
    texts += [f"{m}e{e}" for m, e in zip(mant.tolist(), exps.tolist())]
    texts += ["0.1", "0.3", "2.2250738585072011e-308", "9007199254740993", "1e23", "8.98846567431158e307",
              "9999999999999999999", "99999999999999999999.5", "1234567890123456789e-5", "0.00000000000000000001"]
    got = parse_text("\n".join(texts).encode(), len(texts), Layout((Column("f", K.FLOAT),)))
    want = np.array([float(t) for t in texts])
    assert not got.bad.any()
    assert got.floats[:, 0].view(np.int64).tolist() == want.view(np.int64).tolist()


def test_lists_and_their_errors():
    col = (Column("n", K.INT), Column("l", K.INT_LIST))
    lines = [b"1\t1|2|3", b"2\t", b"3\t-9223372036854775808", b"4\t1||2", b"5\t9223372036854775808|1", b"6\t7",
             b"x\t1|2"]
    got = parse_text(b"\n".join(lines), len(lines), Layout(col))
    assert got.reasons == {3: "column l (field 2): '1||2' is not a list of decimal integers separated by '|'",
                           4: "column l (field 2): '9223372036854775808|1' has an element out of int64 range",
                           6: "column n (field 1): 'x' is not a decimal integer"}
    lists = got.lists["l"]
    assert lists.offsets.tolist() == [0, 3, 3, 4, 4, 4, 5, 5]
    assert lists.values.tolist() == [1, 2, 3, -(1 << 63), 7]


def test_chunk_shorter_than_its_rows_and_empty_lines():
    layout = Layout((Column("a", K.INT),))
    got = parse_text(b"1\n\n3", 4, layout)
    assert got.ints[:, 0].tolist() == [1, 0, 3, 0]
    assert got.missing[:, 0].tolist() == [False, True, False, True]
    assert got.bad.tolist() == [False, False, False, True]
    assert "ends before this line" in got.reasons[3]


def test_short_chunks_need_no_second_signature_of_the_kernel():
    """Data of 8 bytes or fewer (a file's short last line; the over-long-line path's ``b"\\n"``) is parsed as the
    reference parses it, with the kernel's one signature (a view of the data's 8-byte words, which the kernel
    once took, was C-contiguous there, a second overload for numba to compile or load)."""
    from feedline.loader.sources.text_parse import _parse

    layout = Layout((Column("a", K.INT), Column("h", K.HEX)))
    check_against_reference([b"12\tff", b"345\tab"], layout)
    signatures = list(_parse.signatures)
    for lines in ([b""], [b"1\ta"], [b"12\tf"], [b"1\t2", b"3\t4"], [b"1\t2", b"-3\tc"], [b"1"], [b"123456\tf"]):
        for final_newline in (True, False):
            check_against_reference(lines, layout, final_newline)
    got = parse_text(b"1\t2", 2, layout)
    assert got.bad.tolist() == [False, True] and "ends before this line" in got.reasons[1]
    assert list(_parse.signatures) == signatures


def test_a_16_digit_id_with_non_hex_low_digits_is_not_hexadecimal():
    """A 16-digit id whose last 8 characters are not hex is 'not a hexadecimal integer' (the vectorised parser
    this one replaced said 'out of int64 range', as it checked the halves apart)."""
    cols = (Column("h", K.HEX),)
    got = parse_text(b"ffffffffzzzzzzzz\n", 1, Layout(cols))
    assert got.reasons == {0: "column h (field 1): 'ffffffffzzzzzzzz' is not a hexadecimal integer"}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(hex_text, st.binary(max_size=20)), min_size=1, max_size=30))
def test_hex_strings_of_parquet_like_python(texts):
    """Parquet's hex string columns (``hex_strings``): ids as ``int(text, 16)`` within int64."""
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in texts], out=offsets[1:])
    values = np.empty(len(texts), dtype=np.int64)
    status = np.empty(len(texts), dtype=np.int8)
    hex_strings(offsets, np.frombuffer(b"".join(texts), dtype=np.uint8).copy(), values, status)
    for t, v, code in zip(texts, values.tolist(), status.tolist()):
        want = _integer(t, _HEX, 16, 0) if t else 0
        assert (code, v) == ((0, want) if isinstance(want, int) else (1 if want == "not" else 2, 0)), t


@pytest.mark.parametrize("name", sorted(SYNTAXES))
def test_int_and_hex_fields_of_every_length_with_every_byte(name):
    """Integer and hex fields of up to 8 bytes are read with the 8 bytes before their end (the first delimiter
    or, for the last field, the newline after them): fields of every length 0-9 (an 8-digit id, a negative
    8-byte integer, "-" alone), each byte value but the newline put at each place of them, the last field
    an integer or an id, read as the reference reads them."""
    syntax = SYNTAXES[name]
    d = syntax.delimiter.encode()
    for last in (K.INT, K.HEX):
        cols = (Column("i", K.INT), Column("h", K.HEX), Column("r", K.INT, required=True), Column("z", last))
        lines = [d.join([b"1", b"2", b"3", b"4"])]
        for i, h in [(b"", b""), (b"-", b"0"), (b"-1234567", b"8d84c92e"), (b"12345678", b"0b48a8fa"),
                     (b"123456789", b"123456789"), (b"-12345678", b"ABCDEFab"), (b"7", b"abcdefg")]:
            for z in (b"", b"9", b"-5", b"ffffffff", b"12345678", b"0123456789"):
                good = d.join([i, h, b"42", z])
                lines.append(good)
                for byte in (0x00, 0x09, 0x0D, 0x10, 0x19, 0x20, 0x22, 0x2C, 0x2D, 0x2F, 0x30, 0x39, 0x3A, 0x3B,
                             0x40, 0x41, 0x46, 0x47, 0x50, 0x60, 0x61, 0x66, 0x67, 0x7C, 0x7F, 0x80, 0xB0, 0xFF):
                    lines += [good[:at] + bytes([byte]) + good[at:] for at in range(len(good) + 1)]
                lines.append(d.join([i, h, b"", z]))  # a required field empty
        check_against_reference(lines, Layout(cols, syntax))


@pytest.mark.parametrize("name", sorted(SYNTAXES))
def test_fields_ending_at_every_place_of_a_64_byte_block(name):
    """The fast reader takes a line's field ends from masks of 64 bytes at a time (the data's blocks from its
    start; its last bytes one by one): a string of every length 0-140 before an integer, an id and a float, so
    that their ends fall at every place of a block, on either side of a block's edge and past a block with no
    end at all; a wrong byte (control character, quote, delimiter of another syntax, letter) put around them;
    a Windows line ending where the syntax takes one. Each line also comes last in a chunk of its own, with
    and without its newline (its ends among the data's last bytes); and lines of 4-20 KB, longer than the
    blocks the reader computes ahead of a line."""
    syntax = SYNTAXES[name]
    d = syntax.delimiter.encode()
    layout = Layout((Column("s", K.STRING), Column("i", K.INT), Column("h", K.HEX), Column("f", K.FLOAT)), syntax)
    first = d.join([b"first", b"1", b"2", b"3"])  # so that the lines below start past the chunk's first word
    lines = [first]
    for n in range(141):
        good = d.join([bytes(0x61 + k % 26 for k in range(n)), b"-42", b"8d84c92e", b"1.5"])
        variants = [good, good + b"\r", good[:n + 1] + good[n + 4:]]  # (an empty integer)
        for at in (n - 1, n, n + 1, n + 3, n + 4, n + 5, n + 12, n + 13, n + 14, len(good)):
            variants += [good[:at] + bytes([byte]) + good[at:] for byte in (0x00, 0x09, 0x0D, 0x20, 0x22, 0x2C,
                                                                             0x3B, 0x67) if at >= 0]
        lines += variants
        for line in (good, variants[-1]):
            for final_newline in (True, False):
                check_against_reference([first, line], layout, final_newline)
    check_against_reference(lines, layout)
    long_lines = [d.join([bytes(0x61 + k % 26 for k in range(n)), b"7", b"ab", b"2"]) for n in (4000, 9000, 20000)]
    check_against_reference([first] + long_lines + lines[:100] + long_lines, layout)


def test_lines_shorter_than_a_word():
    """Lines of 1-7 bytes one after the other: the fast reader reads the 8 bytes before a field's end, here
    bytes of the lines before, which it must ignore."""
    for syntax in (TSV, CSV):
        d = syntax.delimiter.encode()
        layout = Layout((Column("i", K.INT), Column("h", K.HEX)), syntax)
        lines = [d.join([i, h]) for i in (b"", b"1", b"-", b"-7", b"123") for h in (b"", b"a", b"fF", b"g")]
        check_against_reference(lines * 3, layout)
        check_against_reference(lines * 3, layout, final_newline=False)


def test_minus_as_the_delimiter():
    """With '-' as the delimiter, an empty integer field's first byte (the delimiter after it) is a '-': not a
    sign (a field "-" alone is not a number, an empty one is missing)."""
    syntax = TextSyntax(delimiter="-", list_delimiter="|")
    layout = Layout((Column("a", K.INT), Column("b", K.INT), Column("c", K.HEX)), syntax)
    lines = [b"1-2-3", b"--", b"12--ff", b"-5-", b"1--", b"--a", b"0-0-0"]
    check_against_reference(lines * 3, layout)
