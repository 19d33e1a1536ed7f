"""Row blocks (``ops.row_blocks``): rows packed into blocks and gathered back are the values given, for every
layout, by the numba kernels and by the NumPy reference alike; wrong inputs are named."""
import numpy as np
import pytest

from feedline import ops
from feedline.ops import _native


@pytest.fixture(params=["numba", "numpy"])
def kernels(request, monkeypatch):
    if request.param == "numba":
        pytest.importorskip("numba")
        monkeypatch.delenv(_native.ENV, raising=False)
    else:
        monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    yield request.param
    _native.kernels.cache_clear()


def _table(rng, rows, layout):
    return {"label": rng.standard_normal(rows).astype(np.float32) if layout.label else None,
            "dense": rng.standard_normal((rows, layout.dense)).astype(np.float32) if layout.dense else None,
            "ids": rng.integers(0, 1 << 32, (layout.ids, rows), dtype=np.int64) if layout.ids else None,
            "more": rng.integers(0, 1 << 32, (layout.more, rows), dtype=np.int64) if layout.more else None}


def _part(table, rows):
    return {name: None if a is None else np.ascontiguousarray(a[..., rows] if name in ("ids", "more") else a[rows])
            for name, a in table.items()}


@pytest.mark.parametrize("label,dense,ids,more", [(1, 13, 26, 0), (0, 0, 3, 2), (1, 0, 0, 0), (0, 4, 0, 1),
                                                  (1, 2, 1, 3)])
def test_packed_rows_gather_back_exactly(kernels, label, dense, ids, more):
    rng = np.random.default_rng(label * 1000 + dense * 100 + ids * 10 + more)
    layout = ops.RowLayout(label=label, dense=dense, ids=ids, more=more)
    chunk_rows = np.array([700, 1, 333, 1200], dtype=np.int64)
    first_row = np.concatenate([[0], np.cumsum(chunk_rows)[:-1]]).astype(np.int64)
    num_rows = int(chunk_rows.sum())
    table = _table(rng, num_rows, layout)
    blocks = ops.RowBlocks(chunk_rows, layout)
    for c, (first, rows) in enumerate(zip(first_row.tolist(), chunk_rows.tolist())):
        block = layout.empty(rows)
        for start in range(0, rows, 256):  # packed in runs, as a chunk is prepared
            stop = min(rows, start + 256)
            ops.pack_rows(block, start, layout, **_part(table, np.arange(first + start, first + stop)))
        blocks.set(c, block)
    wanted = rng.permutation(num_rows)[:1500]
    chunk, local = np.empty(wanted.size, np.int64), np.empty(wanted.size, np.int64)
    touched, counts = np.empty(4, np.int64), np.empty(4, np.int64)
    found = ops.locate_rows(wanted, first_row, num_rows, chunk, local, touched, counts)
    assert found == 4 and counts[:found].sum() == wanted.size
    assert np.array_equal(first_row[chunk] + local, wanted)
    expected = _part(table, wanted)
    out = {name: None if a is None else np.empty_like(a) for name, a in expected.items()}
    ops.gather_rows(blocks, chunk, local, **out)
    for name, a in expected.items():
        if a is not None:  # bit for bit: NaN payloads and negative zeros too
            assert np.array_equal(out[name].view(np.uint32) if a.dtype == np.float32 else out[name],
                                  a.view(np.uint32) if a.dtype == np.float32 else a), name


def test_wrong_inputs_are_named(kernels):
    layout = ops.RowLayout(label=0, dense=0, ids=2, more=0)
    block = layout.empty(4)
    with pytest.raises(ValueError, match=r"ids must hold ids in \[0, 4294967295\]"):
        ops.pack_rows(block, 0, layout, ids=np.array([[1, 2, 3, 4], [0, -1, 0, 0]], dtype=np.int64))
    with pytest.raises(ValueError, match="ids must be a C-contiguous int64"):
        ops.pack_rows(block, 0, layout, ids=np.zeros((3, 4), dtype=np.int64))
    blocks = ops.RowBlocks(np.array([4, 4], dtype=np.int64), layout)
    blocks.set(0, block)
    with pytest.raises(LookupError, match="chunk 1"):
        ops.gather_rows(blocks, np.array([0, 1]), np.array([0, 0]), ids=np.empty((2, 2), dtype=np.int64))
    with pytest.raises(IndexError, match=r"rows must lie in \[0, 8\)"):
        ops.locate_rows(np.array([3, 8]), np.array([0, 4]), 8, *(np.empty(2, np.int64) for _ in range(4)))
    with pytest.raises(ValueError, match="dense must be a number of words >= 0"):
        ops.RowLayout(label=1, dense=-1, ids=0, more=0)


def _least_recently_read_by_sort(kept, pins, read, stamps, since, chunk_rows, excess):
    """The order PreparedRows dropped chunks in before: a stable lexsort of the free held chunks, in held order."""
    held = np.argsort(since, kind="stable")
    held = held[kept[held]]
    free = held[pins[held] == 0]
    free = free[np.lexsort((stamps[free], ~read[free]))]
    out, gone = [], 0
    for c in free.tolist():
        if gone >= excess:
            break
        out.append(c)
        gone += int(chunk_rows[c])
    return out


def test_least_recently_read_drops_read_then_oldest_then_first_held(kernels):
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        kept = rng.random(n) < 0.7
        pins = np.where(rng.random(n) < 0.2, 1, 0).astype(np.int64)
        read = rng.random(n) < 0.5
        stamps = rng.integers(0, 4, n).astype(np.int64)  # (many ties)
        since = rng.permutation(n).astype(np.int64)
        chunk_rows = rng.integers(1, 10, n).astype(np.int64)
        excess = int(rng.integers(-3, 40))
        out = np.full(n, -7, dtype=np.int64)
        got = ops.row_blocks.least_recently_read(kept, pins, read, stamps, since, chunk_rows, excess, out)
        assert out[:got].tolist() == _least_recently_read_by_sort(kept, pins, read, stamps, since, chunk_rows, excess)


def test_a_block_set_with_its_address_is_gathered_from_it():
    layout = ops.RowLayout(label=1, dense=1, ids=0, more=0)
    blocks = ops.RowBlocks(np.array([2], dtype=np.int64), layout)
    block = np.zeros((2, 2), dtype=np.uint32)
    blocks.set(0, block, block.ctypes.data)
    assert blocks.addresses[0] == block.ctypes.data
    blocks.set(0, block)
    assert blocks.addresses[0] == block.ctypes.data


def test_touched_chunks_are_pinned_then_read_and_unpinned_in_one_pass(kernels):
    rng = np.random.default_rng(3)
    for trial in range(100):
        n = int(rng.integers(1, 30))
        found = int(rng.integers(0, n + 1))
        touched = np.concatenate([rng.permutation(n)[:found], np.full(3, -5)]).astype(np.int64)  # (past found: not read)
        pins = rng.integers(0, 3, n).astype(np.int64)
        kept, bad = rng.random(n) < 0.6, rng.random(n) < 0.3
        stamps, read = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
        chunks = touched[:found]
        before = pins.copy()
        out = np.full(found + 3, -1, dtype=np.int64)
        missing = ops.row_blocks.pin_chunks(touched, found, pins, kept, out)
        assert out[:missing].tolist() == [c for c in chunks.tolist() if not kept[c]]
        assert (pins - before).tolist() == [int(c in chunks) for c in range(n)]
        with_bad = ops.row_blocks.unpin_read_chunks(touched, found, pins, stamps, 9, read, bad, out)
        assert out[:with_bad].tolist() == [c for c in chunks.tolist() if bad[c]]
        assert pins.tolist() == before.tolist()
        assert read.tolist() == [c in chunks for c in range(n)] and stamps.tolist() == [9 * (c in chunks) for c in range(n)]
