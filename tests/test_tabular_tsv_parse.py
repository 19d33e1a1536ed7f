"""The TSV parser (text_parse) against Python's int() on generated decimal and hex fields, valid and invalid."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from feedline.loader.errors import DataError
from feedline.loader.sources import open_source
from feedline.loader.sources.text_parse import parse_text
from feedline.loader.sources.text_syntax import Layout
from feedline.pipelines.tabular import Column, ColumnKind, FileFormat, TabularFiles

INT64_MAX = 2**63 - 1
COLUMNS = (Column("d", ColumnKind.INT, required=True), Column("h", ColumnKind.HEX))

decimal_text = st.one_of(
    st.integers(-INT64_MAX, INT64_MAX).map(str),
    st.integers(0, 10**25).map(str),  # beyond int64 too
    st.tuples(st.integers(0, 12), st.integers(0, 10**6)).map(lambda t: "0" * t[0] + str(t[1])),
    st.text(alphabet="0123456789-+.eEnaif x:/", min_size=0, max_size=22),
)
hex_text = st.one_of(
    st.integers(0, 2**64).map(lambda v: format(v, "x")),
    st.integers(0, 2**32).map(lambda v: format(v, "08X")),
    st.tuples(st.integers(0, 20), st.integers(0, 2**40)).map(lambda t: "0" * t[0] + format(t[1], "x")),
    st.text(alphabet="0123456789abcdefABCDEFgxyz-+ G@`/:", min_size=0, max_size=20),
)


def oracle_decimal(text: str):
    """("value", v), ("missing",) or ("bad",), by Python's rules."""
    if text == "":
        return ("missing",)
    body = text[1:] if text.startswith("-") else text
    if not body or not all(c in "0123456789" for c in body):
        return ("bad",)
    value = int(text)
    return ("value", value) if -INT64_MAX <= value <= INT64_MAX else ("bad",)


def oracle_hex(text: str):
    if text == "":
        return ("missing",)
    if not all(c in "0123456789abcdefABCDEF" for c in text):
        return ("bad",)
    value = int(text, 16)
    return ("value", value) if value <= INT64_MAX else ("bad",)


def parse(lines: list[bytes]):
    return parse_text(b"\n".join(lines) + b"\n", len(lines), Layout(COLUMNS))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(decimal_text, hex_text), min_size=1, max_size=40))
def test_fields_parse_like_python(rows):
    parsed = parse([f"{d}\t{h}".encode() for d, h in rows])
    for i, (d, h) in enumerate(rows):
        want_d, want_h = oracle_decimal(d), oracle_hex(h)
        expect_bad = want_d[0] != "value" or want_h[0] == "bad"  # d is required
        assert bool(parsed.bad[i]) == expect_bad, (d, h, parsed.reasons.get(i))
        if not expect_bad:
            assert int(parsed.ints[i, 0]) == want_d[1], d
            assert int(parsed.ints[i, 1]) == (want_h[1] if want_h[0] == "value" else 0), h
            assert bool(parsed.missing[i, 1]) == (h == "")


def test_reasons_name_column_and_text():
    lines = [b"12\tff", b"x1\tff", b"5\tfg", b"\t1", b"99999999999999999999\t1", b"1\t10000000000000000", b"1"]
    parsed = parse(lines)
    assert parsed.bad.tolist() == [False, True, True, True, True, True, True]
    assert [parsed.reasons[i] for i in range(1, 7)] == [
        "column d (field 1): 'x1' is not a decimal integer",
        "column h (field 2): 'fg' is not a hexadecimal integer",
        "column d (field 1): is empty, and a value is required",
        "column d (field 1): '99999999999999999999' is out of int64 range",
        "column h (field 2): '10000000000000000' is out of int64 range",
        "expected 2 tab-separated fields, found 1",
    ]


def test_random_values_round_trip():
    rng = np.random.default_rng(0)
    values = rng.integers(-(2**63), 2**63 - 1, 5000, endpoint=True)
    hexes = rng.integers(0, 2**63 - 1, 5000, endpoint=True)
    parsed = parse([f"{v}\t{h:x}".encode() for v, h in zip(values, hexes)])
    assert not parsed.bad.any()
    assert parsed.ints[:, 0].tolist() == values.tolist()
    assert parsed.ints[:, 1].tolist() == hexes.tolist()


def test_the_parser_says_whether_the_data_held_exactly_its_lines():
    """A chunk's line count is checked by the parser (``exact``): fewer lines, more lines (a field's delimiter
    become a newline, the bytes the same), or the same lines with or without the last newline."""
    lines = [b"1\ta", b"2\tb", b"3\tc"]
    text = b"\n".join(lines) + b"\n"
    assert parse_text(text, 3, Layout(COLUMNS)).exact
    assert parse_text(text[:-1], 3, Layout(COLUMNS)).exact
    assert not parse_text(text, 4, Layout(COLUMNS)).exact
    assert not parse_text(text, 2, Layout(COLUMNS)).exact
    assert not parse_text(text.replace(b"\tb", b"\nb"), 3, Layout(COLUMNS)).exact


def test_a_chunk_whose_line_count_changed_in_place_raises(tmp_path):
    """A line split in two inside a chunk (the same bytes, so the same chunk edges): only its line count tells."""
    path = tmp_path / "t.tsv"
    path.write_bytes(b"".join(f"{k}\t{k:x}\n".encode() for k in range(1000)))
    table = open_source(TabularFiles((str(path),), FileFormat.TSV, COLUMNS), cache=None)
    path.write_bytes(path.read_bytes().replace(b"\n500\t1f4\n", b"\n500\n1f4\n"))
    with pytest.raises(DataError, match=f"^{path}: changed since it was indexed: lines 1-1000 .* 1001 line ends"):
        table.read(np.arange(1000))
