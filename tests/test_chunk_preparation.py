"""What preparing a text chunk builds once instead of per chunk (issue 18, less GIL per batch): a row-major block's
layout is made once per column count and shared; a parse without quoting shares one never-written scratch, and a
quoted parse still unquotes into a scratch of its own."""
import numpy as np

from feedline import ops
from feedline.loader.sources.text_parse import parse_text
from feedline.loader.sources.text_syntax import CSV, Layout
from feedline.ops.gather_columns import BYTE_FLAGS, CODES
from feedline.pipelines.tabular import Column, ColumnKind


def test_a_row_major_layout_is_made_once_per_column_count_and_says_where_each_column_is():
    values = np.arange(12, dtype=np.int64).reshape(4, 3)
    missing = np.zeros((4, 3), dtype=bool)
    block = ops.ColumnBlock.row_major(values, missing)
    again = ops.ColumnBlock.row_major(values[:2].copy(), missing[:2].copy())
    assert again.layout is block.layout  # (shared: no list of tuples and array made per chunk)
    code = CODES[np.dtype(np.int64)]
    assert block.layout.tolist() == [[code, c, 3, BYTE_FLAGS, c, 3] for c in range(3)]
    assert block.layout.dtype == np.int64 and block.layout.flags.c_contiguous and block.layout.flags.writeable
    assert block.rows == 4 and np.shares_memory(block.data, values)
    label, dense, ids = np.zeros(4, np.float32), np.zeros((1, 4), np.float32), np.zeros((1, 4), np.int64)
    local = np.arange(4, dtype=np.int64)
    ops.gather_columns(block, ops.gather_picks(0, [1], [2]), local, local, missing_id=-1, label=label, dense=dense,
                       ids=ids)
    assert label.tolist() == [0, 3, 6, 9] and dense.tolist() == [[1, 4, 7, 10]] and ids.tolist() == [[2, 5, 8, 11]]
    other = ops.ColumnBlock.row_major(np.zeros((2, 5), np.int64), np.zeros((2, 5), bool))
    assert other.layout.shape == (5, 6) and other.layout is not block.layout


def test_quoted_and_unquoted_parses_side_by_side_keep_their_values():
    columns = (Column("a", ColumnKind.INT), Column("s", ColumnKind.STRING))
    tsv = Layout(columns)
    csv = Layout(columns, CSV)
    plain = parse_text(b"1\tx\n2\ty\n", 2, tsv)
    quoted = parse_text(b'1,"x"\r\n2,"y"\r\n', 2, csv)
    plain_again = parse_text(b"1\tx\n2\ty\n", 2, tsv)
    assert plain.ints.tolist() == quoted.ints.tolist() == plain_again.ints.tolist()
    assert not plain.bad.any() and not quoted.bad.any() and plain.exact and quoted.exact
    bad = parse_text(b"1\tx\nzz\ty\n", 2, tsv)
    assert bad.bad.tolist() == [False, True] and 1 in bad.reasons and bad.exact


class _NoPass(np.ndarray):
    """A bad-rows mask that refuses a pass over it (``pack_chunk`` knows from the reasons whether any row is bad)."""

    def any(self, *args, **kwargs):
        raise AssertionError("a pass over bad")


def test_pack_chunk_tells_bad_rows_from_their_reasons_without_a_pass_over_bad():
    from feedline.loader.sources.chunked import RowsChunk, pack_chunk

    ints, missing = np.arange(6, dtype=np.int64).reshape(3, 2), np.zeros((3, 2), dtype=bool)
    for bad, reasons in ((np.zeros(3, bool), {}), (np.array([False, True, False]), {1: "bad value"})):
        packed = pack_chunk(RowsChunk({}, bad.view(_NoPass), reasons, ints, missing, None), ["a", "b"], [], [])
        assert packed.any_bad is bool(reasons) and packed.reasons == reasons
        assert packed.block.rows == 3 and np.shares_memory(packed.block.data, ints)  # (no float block: in place)
    floats = np.array([[0.5], [1.5], [2.5]])
    packed = pack_chunk(RowsChunk({}, np.zeros(3, bool).view(_NoPass), {}, ints, np.zeros((3, 3), bool), floats),
                        ["a", "b"], ["f"], [])
    assert packed.block.layout.shape == (3, 6)
    assert packed.block.data[3 * 2 * 8:].view(np.float64).tolist() == [0.5, 1.5, 2.5]


def test_a_layout_without_lists_or_floats_parses_with_shared_empties_and_one_with_them_with_its_own(monkeypatch):
    import feedline.loader.sources.text_parse as text_parse

    seen = []
    kernel = text_parse._parse

    def spy(*args):
        seen.append((args[16], args[17], args[22]))  # list_offsets, lists, fallback
        return kernel(*args)

    monkeypatch.setattr(text_parse, "_parse", spy)
    plain = Layout((Column("a", ColumnKind.INT), Column("s", ColumnKind.STRING)))
    for _ in range(2):
        assert parse_text(b"1\tx\n2\ty\n", 2, plain).ints[:, 0].tolist() == [1, 2]
    offsets, lists, fallback = text_parse._NO_LISTS + (text_parse._NO_FALLBACK,)
    assert all(got[0] is offsets and got[1] is lists and got[2] is fallback for got in seen)
    assert offsets.shape == (0, 1) and lists.shape == (0, 0) and fallback.shape == (0, 6)
    mixed = Layout((Column("f", ColumnKind.FLOAT), Column("l", ColumnKind.INT_LIST)))
    chunk = parse_text(b"1.5\t1|2\n1e400\t3\n", 2, mixed)
    assert seen[-1][0] is not offsets and seen[-1][2] is not fallback
    assert chunk.floats[0, 0] == 1.5 and chunk.bad.tolist() == [False, True]
    assert chunk.lists["l"].offsets.tolist() == [0, 2, 2] and chunk.lists["l"].values.tolist() == [1, 2]
    assert offsets.shape == (0, 1) and lists.shape == (0, 0) and fallback.shape == (0, 6)
