"""A converted table's batch gathered by address in one native call (``ops.gather_table``, through
``ChunkedTable.gather``): the same bits as the grouped gather (``group_by_chunk`` + ``gather_blocks``) and as the
text table, chunks it lacks left to the grouped gather, and the addresses it reads only those of cached chunks."""
from __future__ import annotations

import numpy as np
import pytest

from feedline.loader.sources import chunked, open_source
from feedline.ops import _native
from feedline.pipelines.features import MISSING_ID
import record_blocks

needs_numba = pytest.mark.skipif(_native.kernels("gather") is None, reason="numba is not installed")
CHUNK = 256
ROWS = 3000  # 12 chunks, the last one short


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return record_blocks.criteo_day_in_chunks(tmp_path_factory.mktemp("table"), ROWS, 5, CHUNK)


def gathered(spec, source, rows):
    parse = spec.stages[0]
    n = rows.size
    label = np.full(n, 7.0, np.float32)
    dense = np.full((len(parse.dense), n), 7.0, np.float32)
    ids = np.full((len(parse.categorical), n), 7, np.int64)
    got = source.gather(rows, label=parse.label, dense=parse.dense, categorical=parse.categorical,
                        missing_id=MISSING_ID, label_out=label, dense_out=dense, ids_out=ids)
    assert not got.bad.any() and got.bad.shape == (n,) and not got.lists
    return label.tobytes(), dense.tobytes(), ids.tobytes()


def counting(monkeypatch):
    """``gather_table``'s answers, as ``ChunkedTable.gather`` gets them."""
    answers = []
    real = chunked.gather_table

    def gather_table(*args, **kwargs):
        answers.append(real(*args, **kwargs))
        return answers[-1]

    monkeypatch.setattr(chunked, "gather_table", gather_table)
    return answers


@needs_numba
def test_a_cached_table_is_gathered_in_one_call_with_the_bits_of_the_grouped_gather(tables, monkeypatch):
    text, conv = tables
    source = open_source(conv.source, cache_rows=ROWS)
    source.warm(list(range(source.chunk_rows.size)))
    grouped = open_source(conv.source, cache_rows=ROWS)
    grouped._by_address = False
    reference = open_source(text.source, cache_rows=ROWS)
    answers = counting(monkeypatch)

    def no_grouping(*args, **kwargs):
        raise AssertionError("the rows were grouped in Python")

    for seed in range(4):
        rng = np.random.default_rng(seed)
        rows = rng.permutation(ROWS)[:rng.integers(1, ROWS)]
        expected = gathered(conv, grouped, rows)
        assert gathered(conv, reference, rows) == expected
        with monkeypatch.context() as m:
            m.setattr(chunked.ops, "group_by_chunk", no_grouping)
            assert gathered(conv, source, rows) == expected
    assert len(answers) == 4 and all(a > 0 for a in answers)
    # in order: the short last chunk among them, with rows from one chunk only, and no rows
    for rows in (np.arange(ROWS - 300, ROWS), np.arange(10, 20), np.zeros(0, np.int64)):
        assert gathered(conv, source, rows) == gathered(conv, grouped, rows)
    assert answers[-3:] == [2, 1, 0]


@needs_numba
def test_chunks_not_cached_are_left_to_the_grouped_gather(tables, monkeypatch):
    text, conv = tables
    source = open_source(conv.source, cache_rows=1)  # room for 6 chunks; the rows below touch all 12
    reference = open_source(text.source, cache_rows=ROWS)
    answers = counting(monkeypatch)
    rows = np.random.default_rng(9).permutation(ROWS)[:2500]
    assert gathered(conv, source, rows) == gathered(conv, reference, rows)
    assert answers == [] and source.uncached_gathers == 0  # (nothing cached yet: not asked)
    assert gathered(conv, source, rows) == gathered(conv, reference, rows)
    assert answers == [-1] and source.uncached_gathers == 1  # counted where it fell back for an uncached chunk
    cached = set(source._cache)
    held, addresses, layouts = source._cache.addressed()
    assert len(held) == len(cached) and layouts.shape[0] == source.chunk_rows.size
    assert {c for c in range(source.chunk_rows.size) if addresses[c, 0]} == cached  # evicted ones: zero
    in_cache = np.concatenate([np.arange(source.first_row[c], source.first_row[c] + source.chunk_rows[c])
                               for c in sorted(cached)])
    rows = np.random.default_rng(10).permutation(in_cache)
    assert gathered(conv, source, rows) == gathered(conv, reference, rows)
    assert answers[-1] == len(cached) and source.uncached_gathers == 1
    with pytest.raises(IndexError):
        gathered(conv, source, np.array([0, ROWS], np.int64))
    assert answers[-1] == -2 and source.uncached_gathers == 1  # (rows out of range: not a chunk missing)


def rows_of(source, chunks):
    return np.concatenate([np.arange(source.first_row[c], source.first_row[c] + source.chunk_rows[c]) for c in chunks])


@needs_numba
def test_chunks_warmed_for_the_next_buffer_full_outlive_those_gathered_again(tables, monkeypatch):
    """The cache drops chunks in the order they were warmed (the order the batches need them in): the chunks of the
    buffer-full being gathered, read by batch after batch, are dropped before those warmed for the next one (when a
    gather made its chunks the most lately used, the next buffer-full's were dropped and read again: ~10-20% of an
    epoch's chunk loads of data/criteo.tsv's table cache)."""
    text, conv = tables
    monkeypatch.setattr(chunked, "CHUNKS_BEYOND", 0)
    source = open_source(conv.source, cache_rows=4 * CHUNK)  # room for 4 chunks
    reference = open_source(text.source, cache_rows=ROWS)
    answers = counting(monkeypatch)
    now = np.random.default_rng(3).permutation(rows_of(source, [0, 1]))
    source.warm([0, 1])
    assert gathered(conv, source, now[:200]) == gathered(conv, reference, now[:200])
    source.warm([2, 3])  # the next buffer-full's
    assert gathered(conv, source, now[200:]) == gathered(conv, reference, now[200:])
    source.warm([4, 5])  # the one after: drops the chunks of the buffer-full done, not those warmed for the next
    assert sorted(source._cache) == [2, 3, 4, 5]
    assert answers == [2, 2] and source.uncached_gathers == 0


@needs_numba
def test_a_chunk_not_yet_cached_is_read_and_the_gather_stays_one_call(tables, monkeypatch):
    """A gather by address that meets a chunk not cached (mostly one another thread is warming) reads it (or waits
    for it) and gathers by address again, where the cache holds every chunk the rows touch."""
    text, conv = tables
    source = open_source(conv.source, cache_rows=1)  # room for 6 chunks
    reference = open_source(text.source, cache_rows=ROWS)
    answers = counting(monkeypatch)
    source.warm([0, 1])
    rows = np.random.default_rng(4).permutation(rows_of(source, [0, 1, 2]))
    assert gathered(conv, source, rows) == gathered(conv, reference, rows)
    assert answers == [-1, 3] and source.uncached_gathers == 0 and sorted(source._cache) == [0, 1, 2]


@needs_numba
def test_the_loader_stats_count_the_gathers_that_fell_back(tables):
    """``loader.stats()["uncached_gathers"]``: the table's count of batches gathered the grouped way because a
    chunk was not cached; None for a source that gathers no other way."""
    from feedline.loader import Loader

    _, conv = tables
    with Loader(conv, 256, placement="cpu", seed=3, shuffle_buffer=256, num_threads=1) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
        assert stats["uncached_gathers"] == loader.source.uncached_gathers
        assert isinstance(stats["uncached_gathers"], int) and stats["uncached_gathers"] >= 0
        loader.source.uncached_gathers = 5
        assert loader.stats()["uncached_gathers"] == 5


def test_a_text_table_is_not_read_by_address(tables, monkeypatch):
    text, _ = tables
    source = open_source(text.source, cache_rows=ROWS)
    answers = counting(monkeypatch)
    rows = np.arange(0, ROWS, 7)
    gathered(text, source, rows)
    assert source._cache.addressed() is None and answers == []


def test_only_blocks_of_records_with_bit_flags_get_an_address():
    """Row-major blocks with byte flags (a version-1 table's chunks) are left to the grouped gather, however many
    are cached (at b52f860 they got addresses, and the table's first gather by address answered -3 and stopped
    it asking for good)."""
    from feedline import ops
    from feedline.loader.sources.chunk_cache import ChunkCache, PackedChunk

    cache = ChunkCache(np.full(3, 4, np.int64), 8, reads_into=True)

    def row_major(c):
        block = ops.ColumnBlock.row_major(np.arange(8, dtype=np.int64).reshape(4, 2), np.zeros((4, 2), bool))
        return PackedChunk(block, {}, np.zeros(4, bool), {}, False)

    for c in range(3):
        cache.get(c, row_major)
    assert cache.addressed() is None
