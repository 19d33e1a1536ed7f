"""``ops.gather_columns.gather_blocks``: a batch's rows of many blocks of row records (a converted table's chunks)
gathered in one native call, in the batch's order. It writes exactly what one ``gather_columns`` per block
writes (NumPy's, the reference) for every type and target, with blocks of different flag places (a short last
chunk; blocks whose columns' types differ: test_gather_narrow_records); it refuses, writing nothing, blocks it cannot take together. A converted table's gather holds every chunk
it touches until that one call returns: chunks evicted meanwhile are never read over before it, which the last
test shows would happen were the buffers not held."""
from __future__ import annotations

import numpy as np
import pytest

from feedline import ops
from feedline.loader.sources import chunk_cache, chunked, open_source
from feedline.ops import _native
from feedline.ops.gather_columns import BIT_FLAGS, IDS, gather_blocks
from feedline.pipelines.features import MISSING_ID
from record_blocks import EVERY_TYPE as TYPES
import record_blocks

rng = np.random.default_rng(77)
needs_numba = pytest.mark.skipif(_native.kernels("gather") is None, reason="numba is not installed")


def record_block(rows: int):
    return record_blocks.record_block(rng, TYPES, rows)


def outputs(n: int, ints: int):
    return np.full(n, -5, np.float32), np.full((len(TYPES), n), -5, np.float32), np.full((ints, n), -5, np.int64)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


@needs_numba
@pytest.mark.parametrize("n", [1, 700, 3000])
def test_one_call_writes_what_a_call_per_block_writes(n, monkeypatch):
    sizes = [1500, 2000, 333, 2000]  # 333: a short chunk, its flags elsewhere in its buffer
    made = [record_block(rows) for rows in sizes]
    first_row = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    rows = rng.integers(0, sum(sizes), n)
    rows[:min(n, 4)] = (first_row + np.array(sizes) - 1)[:min(n, 4)]  # each block's last row (its flags end it)
    chunks, bounds, local, positions = ops.group_by_chunk(rows, first_row, sum(sizes))
    blocks = [made[c][0] for c in chunks.tolist()]
    ints = [j for j, d in enumerate(TYPES) if np.dtype(d).kind != "f"]
    picks = ops.gather_picks(len(TYPES) - 1, list(range(len(TYPES))), ints)
    got = outputs(n, len(ints))
    assert gather_blocks(blocks, picks, bounds, local, positions, missing_id=-99, label=got[0], dense=got[1],
                         ids=got[2])
    want = record_blocks.per_block_reference(blocks, picks, bounds, local, positions, outputs(n, len(ints)),
                                             monkeypatch)
    for a, b in zip(got, want):
        assert same(a, b)
    # and against the values written, independently of either
    chunk_of = np.searchsorted(first_row, rows, side="right") - 1
    within = rows - first_row[chunk_of]
    for j in range(len(TYPES)):
        values = np.array([made[c][1][j][r] for c, r in zip(chunk_of, within)], dtype=TYPES[j])
        gone = np.array([made[c][2][j][r] for c, r in zip(chunk_of, within)], dtype=bool)
        assert same(got[1][j], np.where(gone, np.float32(np.nan), values.astype(np.float32))), j
        if j in ints:
            assert same(got[2][ints.index(j)], np.where(gone, np.int64(-99), values.astype(np.int64))), j


@needs_numba
def test_blocks_it_cannot_take_together_are_refused_writing_nothing():
    block, _, _ = record_block(100)
    local = np.arange(10, dtype=np.int64)
    bounds = np.array([0, 10], dtype=np.int64)
    ints = [j for j, d in enumerate(TYPES) if np.dtype(d).kind != "f"]
    picks = ops.gather_picks(None, [], ints)
    label, dense, ids = outputs(10, len(ints))
    row_major = ops.ColumnBlock.row_major(np.arange(40, dtype=np.int64).reshape(10, 4), np.zeros((10, 4), bool))
    unflagged = block._replace(layout=block.layout.copy())
    unflagged.layout[:, 3] = 0
    fewer = block._replace(layout=block.layout[:5])  # (blocks of different numbers of columns)
    for blocks, these in (([row_major], ops.gather_picks(None, [], [0, 1])), ([unflagged], picks), ([block, fewer], ops.gather_picks(None, [], [0, 1]))):
        groups = np.array([0] + [10] * len(blocks), dtype=np.int64)
        assert not gather_blocks(blocks, these, groups, local, local, missing_id=0, label=label, dense=dense, ids=ids)
    assert (ids == -5).all() and (dense == -5).all() and (label == -5).all()
    assert gather_blocks([], picks, np.zeros(1, np.int64), local[:0], local[:0], missing_id=0, ids=ids)
    assert BIT_FLAGS == 2 and IDS == 2  # (the codes the layouts above use)


def test_without_numba_it_leaves_the_blocks_to_gather_one_by_one(monkeypatch):
    block, _, _ = record_block(50)
    monkeypatch.setenv(_native.ENV, "0")
    _native.kernels.cache_clear()
    try:
        ids = np.full((1, 5), -5, np.int64)
        local = np.arange(5, dtype=np.int64)
        assert not gather_blocks([block], ops.gather_picks(None, [], [0]), np.array([0, 5]), local, local,
                                 missing_id=0, ids=ids)
        assert (ids == -5).all()
    finally:
        monkeypatch.delenv(_native.ENV)
        _native.kernels.cache_clear()


CHUNK = 256


@pytest.fixture(scope="module")
def small_chunks(tmp_path_factory):
    """A Criteo day as text and converted in chunks of 256 rows (12 chunks, the last one short)."""
    return record_blocks.criteo_day_in_chunks(tmp_path_factory.mktemp("blocks"), 3000, 11, CHUNK)


def gathered(spec, source, rows):
    parse = spec.stages[0]
    n = rows.size
    label = np.empty(n, np.float32)
    dense = np.empty((len(parse.dense), n), np.float32)
    ids = np.empty((len(parse.categorical), n), np.int64)
    got = source.gather(rows, label=parse.label, dense=parse.dense, categorical=parse.categorical,
                        missing_id=MISSING_ID, label_out=label, dense_out=dense, ids_out=ids)
    assert not got.bad.any()
    return label, dense, ids


def expected(spec, rows):
    """The rows as the text table reads them (another format, another path), as ``gather`` writes them."""
    parse = spec.stages[0]
    read = open_source(spec.source).read(rows).columns
    label = read[parse.label].values.astype(np.float32)
    dense = np.stack([np.where(read[k].missing, np.float32(np.nan), read[k].values.astype(np.float32))
                      for k in parse.dense])
    ids = np.stack([np.where(read[k].missing, np.int64(MISSING_ID), read[k].values.astype(np.int64))
                    for k in parse.categorical])
    return label, dense, ids


def test_chunks_evicted_during_a_gather_are_not_read_over_before_it(small_chunks):
    text, conv = small_chunks
    source = open_source(conv.source, cache_rows=1)  # room for CHUNKS_BEYOND chunks; a batch below touches all 12
    assert source.chunk_rows.size == 12 and source._cache.limit_rows < (chunked.CHUNKS_BEYOND + 1) * CHUNK < 12 * CHUNK
    for seed in range(3):
        rows = np.random.default_rng(seed).permutation(3000)[:2500]
        for a, b in zip(gathered(conv, source, rows), expected(text, rows)):
            assert same(a, b)


@needs_numba
def test_the_eviction_test_fails_where_buffers_are_read_over_while_held(small_chunks, monkeypatch):
    """The test above would catch a gather whose chunks were not held: a cache that hands out evicted
    buffers whoever holds them gives a wrong batch."""
    text, conv = small_chunks

    def spare_regardless(self, nbytes):
        with self._lock:
            for k in range(len(self._retired)):
                if self._retired[k].nbytes == nbytes:
                    return self._retired.pop(k)
        return None

    monkeypatch.setattr(chunk_cache.ChunkCache, "spare", spare_regardless)
    source = open_source(conv.source, cache_rows=1)
    rows = np.random.default_rng(0).permutation(3000)[:2500]
    assert not all(same(a, b) for a, b in zip(gathered(conv, source, rows), expected(text, rows)))
