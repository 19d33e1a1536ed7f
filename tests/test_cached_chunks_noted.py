"""A known chunk file read back (cached_chunks._read_noted, ~2 a batch in a cached text table's later epochs) gives
the same named tuples a whole read gives, now made in C from their fields: a StoredChunk whose block is an
ops.ColumnBlock, each field where its name says; TableCache.load hands them on as a PackedChunk alike."""
import numpy as np

from feedline import ops
from feedline.loader.sources import cached_chunks, table_cache
from feedline.loader.sources.chunk_cache import PackedChunk


def test_a_noted_read_gives_the_named_tuples_of_a_whole_read(tmp_path):
    rng = np.random.default_rng(2)
    rows = 40
    parsed = cached_chunks.ParsedChunk(rng.integers(-9, 9, size=(rows, 3)).astype(np.int64),
                                       rng.standard_normal((rows, 1)), rng.random((rows, 4)) < 0.3, {},
                                       np.zeros(rows, bool), {})
    key = b"q" * cached_chunks.KEY_BYTES
    made = cached_chunks.encoded(parsed, key, 3e-6)
    size = cached_chunks.write(str(tmp_path), 0, made.pieces)
    known = cached_chunks.Known()
    cached_chunks.note_written(known, str(tmp_path), 0, key, size, made, 3e-6)
    whole = cached_chunks.read(str(tmp_path), 0, key, rows, 4, ())
    noted = cached_chunks.read(str(tmp_path), 0, key, rows, 4, (), known)
    for stored in (whole, noted):
        assert type(stored) is cached_chunks.StoredChunk and type(stored.block) is ops.ColumnBlock
        assert stored._fields == ("block", "lists", "bad", "reasons", "parse_s_per_row", "nbytes")
        assert (stored.lists, stored.reasons, stored.parse_s_per_row, stored.nbytes) == ({}, {}, 3e-6, size)
        assert stored.bad.dtype == bool and stored.bad.shape == (rows,) and not stored.bad.any()
        block = stored.block
        assert block.rows == rows and block.data is block.flags and block.data.dtype == np.uint8
    assert noted.block.data.tobytes() == whole.block.data.tobytes()
    assert np.array_equal(noted.block.layout, whole.block.layout)


def test_table_cache_load_hands_a_stored_chunk_on_as_a_packed_chunk():
    block = ops.ColumnBlock(np.zeros(8, np.uint8), np.zeros(8, np.uint8), np.zeros((1, 6), np.int64), 1)
    packed = table_cache._packed((block, {}, np.zeros(1, bool), {}, False))
    assert type(packed) is PackedChunk and packed == PackedChunk(block, {}, packed.bad, {}, False)
    assert packed.block is block and packed.any_bad is False and packed._replace(any_bad=True).any_bad
